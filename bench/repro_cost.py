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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="cpu_mlp")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args()

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
