"""Start-up cost of the CLI: median wall time of fresh processes, side by side with a baseline.

Runs each command N times, alternating (baseline, help, ...) so that a busy neighbour slows
both alike, and prints a table: median, min, max in ms and the ratio to `python -c pass`.
Acceptance (issue 2): `torchdoctor --help` median < 300 ms on the CPU box.

    python bench/startup.py [--runs 15] [--env]     # --env also times `torchdoctor env` (fewer runs)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP_BUDGET_MS = 300.0


def _machine() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    try:
        load = f", load {os.getloadavg()[0]:.2f}"
    except OSError:
        load = ""
    return f"{platform.node() or 'host'}: {cpu or 'cpu?'}, {cores} cores{load}; Python {platform.python_version()}"


def _time_once(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    dt = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return dt * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--env", action="store_true", help="also time `torchdoctor env` (5 runs)")
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    py = sys.executable
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "torchdoctor --help": [py, "-m", "torchdoctor", "--help"],
    }
    for argv in cases.values():  # warm the page cache and .pyc files once
        _time_once(argv, env)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, argv in cases.items():
            samples[name].append(_time_once(argv, env))
    if args.env:
        argv = [py, "-m", "torchdoctor", "env"]
        _time_once(argv, env)
        samples["torchdoctor env"] = [_time_once(argv, env) for _ in range(5)]
    base = statistics.median(samples["python -c pass"])
    print(f"machine: {_machine()}")
    print(f"{'command':<22} {'runs':>4} {'median ms':>10} {'min':>8} {'max':>8} {'× python':>9}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:<22} {len(xs):>4} {med:>10.1f} {min(xs):>8.1f} {max(xs):>8.1f} {med / base:>9.1f}")
    help_med = statistics.median(samples["torchdoctor --help"])
    ok = help_med < HELP_BUDGET_MS
    print(f"--help median {help_med:.0f} ms: {'within' if ok else 'OVER'} the {HELP_BUDGET_MS:.0f} ms budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
