"""`torchdoctor ask` as a fresh process, side by side with `python -c pass`.

Runs each case N times, alternating (so a busy neighbour slows all alike), and prints median /
min / max wall time in ms, the ratio to `python -c pass`, and whether the run imported torch,
typer, psutil or pynvml (it must not). Acceptance (issue 3): `ask` median < 150 ms on the CPU box;
a 10,000-line log on stdin answered in < 1 s.

    python bench/ask_startup.py [--runs 15]
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
ASK_BUDGET_MS = 150.0
LOG_BUDGET_MS = 1000.0
HEAVY = ("torch", "typer", "click", "psutil", "pynvml", "numpy")


def _log(n: int = 10_000) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ask_logscan import make_training_log  # the same log the tests use

    return make_training_log(n=n, oom=True)


def _time(argv: list[str], env: dict, stdin: str | None = None) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, input=stdin.encode() if stdin else None, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=env, cwd=ROOT)
    dt = (time.perf_counter() - t0) * 1000.0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return dt


def _heavy(argv: list[str], env: dict, stdin: str | None) -> list[str]:
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], input=stdin.encode() if stdin else None,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    mods = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.decode().splitlines() if ln.startswith("import time:")}
    return sorted(m for m in mods if m.split(".")[0] in HEAVY)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("COLUMNS", "100")
    py = sys.executable
    log = _log()
    cases: dict[str, tuple[list[str], str | None]] = {
        "python -c pass": ([py, "-c", "pass"], None),
        "ask SYMPTOM (console)": ([py, "-m", "torchdoctor", "ask", "my loss goes nan after a while"], None),
        "ask SYMPTOM --json": ([py, "-m", "torchdoctor", "ask", "OOM with DDP on 8 GPUs", "--json"], None),
        "ask - < 10k-line log": ([py, "-m", "torchdoctor", "ask", "-"], log),
    }
    for argv, stdin in cases.values():  # warm the page cache and .pyc files once
        _time(argv, env, stdin)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, (argv, stdin) in cases.items():
            samples[name].append(_time(argv, env, stdin))
    base = statistics.median(samples["python -c pass"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.node()}, {cores} cores, load {load:.2f}; Python {platform.python_version()}")
    print(f"{'case':<24} {'runs':>4} {'median ms':>10} {'min':>8} {'max':>8} {'× pass':>7}  heavy imports")
    for name, xs in samples.items():
        argv, stdin = cases[name]
        heavy = "-" if name == "python -c pass" else (", ".join(_heavy(argv, env, stdin)) or "none")
        med = statistics.median(xs)
        print(f"{name:<24} {len(xs):>4} {med:>10.1f} {min(xs):>8.1f} {max(xs):>8.1f} {med / base:>7.1f}  {heavy}")
    ask_med = statistics.median(samples["ask SYMPTOM (console)"])
    log_med = statistics.median(samples["ask - < 10k-line log"])
    ok = ask_med < ASK_BUDGET_MS and log_med < LOG_BUDGET_MS
    print(f"ask median {ask_med:.0f} ms (budget {ASK_BUDGET_MS:.0f}); 10k-line log median {log_med:.0f} ms "
          f"(budget {LOG_BUDGET_MS:.0f}): {'OK' if ok else 'OVER BUDGET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
