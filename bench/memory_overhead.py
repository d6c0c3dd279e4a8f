"""Overhead of the memory instruments vs the bare script, alternating runs.

Configurations, run in turn each round (a busy neighbour slows all alike):

* ``bare``            python WORKLOAD (no torchdoctor)
* ``run``             the harness with only the step clock (probe ``run``)
* ``memory-sampler``  the harness + the per-step memory sampler alone (what ``checkup`` arms
                      of the memory family; growth-site window only if memory rises)
* ``memory``          the full ``memory`` probe: sampler, saved-tensor (activation) counter,
                      breakdown at step 2, grad-in-eval hooks, CUDA memory history with stacks

The workload times its own steady-state steps (bench/workloads/*.py); the ratio of medians
config/bare is the cost inside the step. ``sampler/run`` isolates the sampler from the
harness's own cost.

    python bench/memory_overhead.py --workload cpu_mlp --rounds 5
    python bench/memory_overhead.py --workload gpu_transformer --rounds 3 --json OUT.json

Acceptance (issue 5): per-step sampler overhead <= 1.05x on gpu_transformer (H100).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from overhead import WORKLOADS, machine  # noqa: E402

KINDS = ("bare", "run", "memory-sampler", "memory")
CHILD = ("import json, sys\n"
         "from torchdoctor.pipeline.run import run_probe\n"
         "r = run_probe(sys.argv[1], sys.argv[2], sys.argv[3:], "
         "{'steps': 0, 'timeout': float(%r), 'quiet': True})\n"
         "m = r.metrics.get('memory') or {}\n"
         "w = m.get('sites') or {}\n"
         "print(json.dumps({'findings': [f.code for f in r.findings], 'status': r.status,\n"
         "                  'site_window': {k: w.get(k) for k in ('reason', 'steps', 'boundary_ms')}\n"
         "                  if w else None,\n"
         "                  'heap_trend': (m.get('trend') or {}).get('heap')}))\n")


def run_once(kind: str, workload: Path, wargs: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        res = Path(d) / "r.json"
        base = [str(workload), *wargs, "--result", str(res)]
        if kind == "bare":
            cmd = [sys.executable, *base]
        else:
            cmd = [sys.executable, "-c", CHILD % timeout, kind, *base]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
        wall = time.perf_counter() - t0
        if not res.exists():
            raise SystemExit(f"{kind} run failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        out = json.loads(res.read_text())
        out["wall_s"] = wall
        if kind != "bare":
            out.update(json.loads(p.stdout.strip().splitlines()[-1]))
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="cpu_mlp", help="cpu_mlp | gpu_transformer")
    ap.add_argument("--kind", action="append", choices=KINDS, help="configurations (default all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", dest="json_out", help="write all samples and the summary here")
    ap.add_argument("wargs", nargs=argparse.REMAINDER, help="-- extra workload arguments")
    a = ap.parse_args()
    kinds = a.kind or list(KINDS)
    if "bare" not in kinds:
        kinds.insert(0, "bare")
    workload = WORKLOADS / f"{a.workload}.py"
    wargs = [x for x in a.wargs if x != "--"]
    samples: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for k in (kinds if r % 2 == 0 else list(reversed(kinds))):
            samples[k].append(run_once(k, workload, wargs, a.timeout))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{k} {samples[k][-1]['step_ms']:.3f} ms" for k in kinds), file=sys.stderr, flush=True)
        for k in kinds:
            w = samples[k][-1].get("site_window")
            if w:
                print(f"  {k}: allocation-site window opened ({w['reason']} rising), steps "
                      f"{w['steps']}, {w['boundary_ms']} ms at its boundaries", file=sys.stderr)
    med = {k: statistics.median(s["step_ms"] for s in samples[k]) for k in kinds}
    summary = {"machine": machine(), "workload": a.workload, "rounds": a.rounds, "kinds": {}}
    print(f"\n{summary['machine']}\nworkload {a.workload}, {a.rounds} alternating rounds\n")
    print(f"{'config':<15} {'step ms (median)':>17} {'min':>9} {'max':>9} {'x bare':>7} {'x run':>7}")
    for k in kinds:
        steps = [s["step_ms"] for s in samples[k]]
        vs_run = med[k] / med["run"] if "run" in med else None
        print(f"{k:<15} {med[k]:>17.3f} {min(steps):>9.3f} {max(steps):>9.3f} "
              f"{med[k] / med['bare']:>7.3f} {vs_run if vs_run is not None else float('nan'):>7.3f}")
        summary["kinds"][k] = {"step_ms_median": med[k], "step_ms": steps,
                               "x_bare": med[k] / med["bare"], "x_run": vs_run,
                               "findings": samples[k][-1].get("findings")}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    if a.workload == "gpu_transformer" and "memory-sampler" in med:
        r = med["memory-sampler"] / med["bare"]
        print(f"\nsampler step overhead {r:.3f}x bare (budget 1.05x): {'OK' if r <= 1.05 else 'OVER'}")
        return 0 if r <= 1.05 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
