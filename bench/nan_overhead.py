"""Overhead of the ``nan`` probe (and of the numerics instruments in ``checkup``), side by side
with the bare script.

Each workload script times its own steady state (``--measure`` steps after ``--warmup``, one
device sync before and after the timed block, never inside it) and writes ms/step to a file.
Configurations, run alternately ``--rounds`` times so that a busy neighbour slows all alike:

* ``bare``     python workload.py (no torchdoctor)
* ``run``      the harness with only the step clock (probe ``run``): the runner's own cost
* ``checkup``  probe ``checkup`` (cheap checks; forward watch off, flags read every 8 steps)
* ``checkup+watch``  checkup with the per-module forward watch on (is it cheap enough?)
* ``nan``      probe ``nan`` (forward watch on, flags read every step; no NaN occurs)

Workloads: ``cpu-mlp`` (3-layer MLP, batch 64, 1 thread: the worst case, many tiny modules per
ms), ``gpu-transformer`` (8-layer TransformerEncoder d=768, 12 heads, batch 16 x 512 tokens, bf16
autocast, fused AdamW) and ``gpu-mlp`` (launch-bound small MLP on the GPU).

    python bench/nan_overhead.py --workload cpu-mlp [--rounds 5]
    python bench/nan_overhead.py --workload gpu-transformer --workload gpu-mlp
    python bench/nan_overhead.py --workload gpu-transformer --attribute   # per instrument

Acceptance (issue 6): nan ≤ 2x bare on cpu-mlp, ≤ 1.3x on the H100 workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKLOAD = r'''
import json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

def build(kind):
  torch.manual_seed(0)
  if kind == "cpu-mlp":
      torch.set_num_threads(1)
      dev = "cpu"
      model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                            nn.Linear(256, 10))
      X, Y = torch.randn(64, 64), torch.randint(0, 10, (64,))
      opt = torch.optim.SGD(model.parameters(), lr=0.01)
      def step():
          opt.zero_grad(set_to_none=True)
          F.cross_entropy(model(X), Y).backward()
          opt.step()
  elif kind == "gpu-mlp":
      dev = "cuda"
      model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                            nn.Linear(512, 10)).to(dev)
      X, Y = torch.randn(256, 256, device=dev), torch.randint(0, 10, (256,), device=dev)
      opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
      def step():
          opt.zero_grad(set_to_none=True)
          F.cross_entropy(model(X), Y).backward()
          opt.step()
  elif kind == "gpu-transformer":
      dev = "cuda"
      d, L, B, T, V = 768, 8, 16, 512, 8192  # GPT-2-small-like encoder, 8192 tokens a step
      class LM(nn.Module):
          def __init__(self):
              super().__init__()
              self.emb = nn.Embedding(V, d)
              layer = nn.TransformerEncoderLayer(d, 12, 4 * d, dropout=0.1, batch_first=True,
                                                 norm_first=True)
              self.enc = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
              self.head = nn.Linear(d, V)
          def forward(self, tok):
              return self.head(self.enc(self.emb(tok), is_causal=False))
      model = LM().to(dev)
      opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
      tok = torch.randint(0, V, (B, T), device=dev)
      def step():
          opt.zero_grad(set_to_none=True)
          with torch.autocast("cuda", dtype=torch.bfloat16):
              logits = model(tok)
          F.cross_entropy(logits.float().view(-1, V), tok.view(-1)).backward()
          opt.step()
  else:
      raise SystemExit(f"unknown workload {kind}")

  def sync():
      if dev == "cuda":
          torch.cuda.synchronize()
  return step, sync


def timed(step, sync, warmup, measure):
    for _ in range(warmup):
        step()
    sync()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(measure):
        step()
    sync()
    timed.cpu_ms = (time.thread_time() - c0) / measure * 1e3  # host CPU of the loop's thread
    return (time.perf_counter() - t0) / measure * 1e3


if __name__ == "__main__":
    out, kind, warmup, measure = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    step, sync = build(kind)
    ms = timed(step, sync, warmup, measure)
    json.dump({"step_ms": ms, "cpu_ms": timed.cpu_ms}, open(out, "w"))
'''

SIZES = {"cpu-mlp": (50, 400), "gpu-mlp": (30, 300), "gpu-transformer": (10, 40)}
CONFIGS = {
    "bare": None,
    "run": ("run", {}),
    "checkup": ("checkup", {}),
    "checkup+watch": ("checkup", {"forward_watch": True}),
    "nan": ("nan", {}),
    # the nan probe without the instruments every run arms (crash context, dist, anomaly)
    "nan-only": ("nan", {}, "crashctx,dist_collectives,dist_sampler,dist_steps,training_anomaly"),
}


def build_workload(kind: str, run_name: str):
    """(step, sync) of workload ``kind``, built in this process from :data:`WORKLOAD` (the
    in-process benches time the same code the separate-process runs do)."""
    import runpy

    with tempfile.TemporaryDirectory() as td:
        script = Path(td) / "w.py"
        script.write_text(WORKLOAD)
        ns = runpy.run_path(str(script), run_name=run_name)
    return ns["build"](kind)


def _once(config: str, script: Path, workload: str, tmp: Path) -> tuple[float, float]:
    import subprocess

    warm, n = SIZES[workload]
    out = tmp / f"{config}.json"
    out.unlink(missing_ok=True)
    args = [str(out), workload, str(warm), str(n)]
    spec = CONFIGS[config]
    if spec is None:
        subprocess.run([sys.executable, str(script), *args], check=True)
    else:
        from torchdoctor.pipeline.run import run_probe

        probe, extra = spec[:2]
        old = os.environ.get("TORCHDOCTOR_DISABLE")
        if len(spec) > 2:
            os.environ["TORCHDOCTOR_DISABLE"] = spec[2]
        try:
            rep = run_probe(probe, str(script), args, {"steps": 0, "timeout": 900, "quiet": True,
                                                       **extra})
        finally:
            if len(spec) > 2:
                if old is None:
                    os.environ.pop("TORCHDOCTOR_DISABLE", None)
                else:
                    os.environ["TORCHDOCTOR_DISABLE"] = old
        bad = [f.code for f in rep.findings if f.severity in ("error", "warning")]
        if bad:
            print(f"  note: {config} reported {bad} on a healthy workload", file=sys.stderr)
    r = json.loads(out.read_text())
    return r["step_ms"], r.get("cpu_ms", float("nan"))


def attribute(script: Path, workload: str, rounds: int) -> dict[str, float]:
    """In one process (one model): the step time bare, under the core alone, under the core
    plus each instrument of ``nan``/``checkup`` alone, and under each probe's full set."""
    import runpy
    import statistics as st

    from torchdoctor.pipeline.registry import instruments_for
    from torchdoctor.runner.context import HarnessContext
    from torchdoctor.runner.core import Core
    from torchdoctor.runner.rundir import EvidenceWriter

    ns = runpy.run_path(str(script), run_name="nan_bench_workload")
    step, sync = ns["build"](workload)
    timed = ns["timed"]
    warm, n = SIZES[workload]
    nan_set, chk_set = instruments_for("nan"), instruments_for("checkup")
    configs: dict[str, tuple[str, list, dict] | None] = {"bare": None, "core": ("run", [], {})}
    for c in dict.fromkeys(nan_set + chk_set):
        probe = "nan" if c in nan_set else "checkup"
        configs[f"+{c.name}"] = (probe, [c], {})
    configs["+nan_monitor (no watch)"] = ("nan", [c for c in nan_set if c.name == "nan_monitor"],
                                         {"forward_watch": False})
    configs["nan (all)"] = ("nan", nan_set, {})
    configs["nan (all, sync read)"] = ("nan", nan_set, {"nan_sync_read": True})
    configs["checkup (all)"] = ("checkup", chk_set, {})
    times: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        for name, spec in configs.items():
            if spec is None:
                times[name].append(timed(step, sync, warm, n))
                continue
            probe, classes, extra = spec
            d = tempfile.mkdtemp(prefix="td-attr-")
            ctx = HarnessContext(probe, d, {"steps": 0, **extra}, EvidenceWriter(d))
            core = Core(ctx, [c() for c in classes])
            core.install()
            try:
                times[name].append(timed(step, sync, warm, n))
            finally:
                core.uninstall()
                ctx._writer.close()  # its flush thread would otherwise wake for the rest
    base = st.median(times["bare"])
    print(f"\n{workload}: in-process attribution ({platform.node()}; median of {rounds})")
    print(f"{'config':<28} {'ms/step':>9} {'x bare':>7}")
    out = {}
    for name, xs in times.items():
        med = st.median(xs)
        out[name] = med
        print(f"{name:<28} {med:>9.3f} {med / base:>7.2f}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", choices=sorted(SIZES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--attribute", action="store_true",
                    help="in-process: cost of the core and of each instrument alone")
    args = ap.parse_args()
    workloads = args.workload or ["cpu-mlp"]
    configs = [c for c in args.configs.split(",") if c]
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    results = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        script = tmp / "workload.py"
        script.write_text(WORKLOAD)
        if args.attribute:
            for wl in workloads:
                results[wl] = attribute(script, wl, args.rounds)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
            return 0
        for wl in workloads:
            samples: dict[str, list[float]] = {c: [] for c in configs}
            cpu: dict[str, list[float]] = {c: [] for c in configs}
            for _ in range(args.rounds):
                for c in configs:
                    ms, cms = _once(c, script, wl, tmp)
                    samples[c].append(ms)
                    cpu[c].append(cms)
            base = statistics.median(samples["bare"]) if "bare" in samples else None
            print(f"\n{wl}  ({platform.node()}, Python {platform.python_version()}; "
                  f"median of {args.rounds} rounds)")
            print(f"{'config':<15} {'ms/step':>9} {'min':>8} {'max':>8} {'x bare':>7} {'host CPU ms':>12}")
            results[wl] = {}
            for c, xs in samples.items():
                med = statistics.median(xs)
                ratio = med / base if base else float("nan")
                cmed = statistics.median(cpu[c])
                results[wl][c] = {"median_ms": med, "min_ms": min(xs), "max_ms": max(xs),
                                  "ratio": ratio, "host_cpu_ms": cmed}
                print(f"{c:<15} {med:>9.3f} {min(xs):>8.3f} {max(xs):>8.3f} {ratio:>7.2f} {cmed:>12.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
