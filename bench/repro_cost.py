"""What `torchdoctor repro` costs when the two runs are identical, next to one bounded run.

Alternates, per round (so a busy neighbour slows both alike):

* **one bounded run**: the workload once through the trials layer (``Trials("run")``, the
  harness with no probe instrument: the run `repro` is made of), ``--steps N``;
* **repro**: ``reprocheck.flow.measure`` on the same workload: run A and run B with the
  fingerprint and RNG instruments, compared (identical: no localising pair).

Prints the medians of the wall times and their ratio (acceptance, issue 17: ≤ 2.2×), and the
median step time (step clock, warm-up left out) of the bounded run vs run A: the per-step cost
of the fingerprint instrument (reductions of every parameter, gradient, batch and root output;
one read at the end).

    python bench/repro_cost.py [--workload cpu_mlp] [--steps 40] [--rounds 3] [--json OUT]
    python bench/repro_cost.py --micro [--device cuda]

``--micro``: in one process, the cpu_mlp model's training step alone and with the fingerprint
work of one step (``reduce3`` of the batch, the output, every gradient and every parameter,
stacked per kind), alternating blocks of steps; prints the median ms per step of each and the
difference: the instrument's reductions without the noise of separate processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BUDGET = 2.2


def machine() -> str:
    try:
        import torch

        dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        tv = torch.__version__
    except Exception:  # noqa: BLE001
        dev, tv = "?", "?"
    return f"{platform.node()} ({os.cpu_count()} CPUs, {dev}, torch {tv}, {platform.python_version()})"


def micro(device: str, blocks: int = 15, per_block: int = 20) -> dict:
    import torch

    from torchdoctor.instruments.repro.fingerprint_reduce import reduce3

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
    params = list(model.parameters())
    kept = []

    def step(fp: bool) -> None:
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if fp:
            kept.append(torch.stack([reduce3(torch, t) for t in (x, y)]))
            kept.append(torch.stack([reduce3(torch, out)]))
            kept.append(torch.stack([reduce3(torch, p.grad) for p in params]))
        opt.step()
        if fp:
            kept.append(torch.stack([reduce3(torch, p) for p in params]))

    def block(fp: bool) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_block):
            step(fp)
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / per_block * 1e3

    for _ in range(3):
        block(False), block(True)
    plain, with_fp = [], []
    for _ in range(blocks):
        plain.append(block(False))
        with_fp.append(block(True))
        kept.clear()
    p, f = statistics.median(plain), statistics.median(with_fp)
    return {"machine": machine(), "device": device, "plain_step_ms": p, "fingerprint_step_ms": f,
            "added_ms": f - p, "ratio": f / p, "tensors_per_step": 2 + 1 + 2 * len(params)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--micro", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workload", default="cpu_mlp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.micro:
        out = micro(a.device)
        print(json.dumps(out, indent=1))
        return 0

    from torchdoctor.reprocheck.flow import measure
    from torchdoctor.trials import BASELINE, Trials

    script = str(ROOT / "bench" / "workloads" / f"{a.workload}.py")
    res = tempfile.mkdtemp(prefix="repro-cost-")
    args = ["--steps", str(a.steps), "--warmup", "5", "--result", os.path.join(res, "r.json")]
    opts = {"steps": a.steps + 5, "timeout": 600}
    one_wall, repro_wall, one_ms, a_ms, identical = [], [], [], [], []
    for r in range(a.rounds):
        with Trials("run", script, args, options=opts) as tr:
            run = tr.run(BASELINE)
            if run.failure():
                raise SystemExit(f"bounded run failed: {run.failure()}")
            one_wall.append(run.wall_s)
            one_ms.append(run.median_ms())
        with Trials("repro", script, args, options=opts) as tr:
            t0 = time.perf_counter()
            data = measure(tr)
            repro_wall.append(time.perf_counter() - t0)
            identical.append(bool(data.get("identical")))
            a_ms.append(tr.runs[0].median_ms())
        print(f"round {r + 1}: one run {one_wall[-1]:.2f} s, repro {repro_wall[-1]:.2f} s "
              f"(identical: {identical[-1]}); step {one_ms[-1]:.3f} vs {a_ms[-1]:.3f} ms", flush=True)
    out = {"machine": machine(), "workload": a.workload, "steps": a.steps + 5, "rounds": a.rounds,
           "one_run_wall_s": statistics.median(one_wall), "repro_wall_s": statistics.median(repro_wall),
           "ratio": statistics.median(repro_wall) / statistics.median(one_wall),
           "one_run_step_ms": statistics.median(one_ms), "repro_run_step_ms": statistics.median(a_ms),
           "identical": all(identical)}
    out["step_overhead"] = out["repro_run_step_ms"] / out["one_run_step_ms"]
    print(json.dumps(out, indent=1))
    print(f"repro / one bounded run: {out['ratio']:.2f}x (budget {BUDGET}x) — "
          f"{'OK' if out['ratio'] <= BUDGET else 'OVER'}; fingerprint step cost "
          f"×{out['step_overhead']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["ratio"] <= BUDGET and out["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
