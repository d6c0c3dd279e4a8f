"""Overhead of torchdoctor's script probes vs the bare script, alternating runs.

For each round, in turn: the bare workload (``python WORKLOAD``) and the workload under each
probe (``python -m torchdoctor PROBE --steps 0 WORKLOAD``), so a busy neighbour slows all
alike. The workload times its own steady-state steps (after warm-up) and writes step_ms; the
ratio of medians probe/bare is the cost of the instruments inside the step. Whole-process
wall time is reported too (start-up and report included).

    python bench/overhead.py --workload cpu_mlp --probe checkup [--probe profile] --rounds 7
    python bench/overhead.py --workload gpu_transformer --probe checkup --rounds 5 --json OUT

Acceptance (issue 4): checkup step overhead <= 1.10x on cpu_mlp, <= 1.05x on gpu_transformer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "bench" / "workloads"
BUDGET = {"cpu_mlp": 1.10, "gpu_transformer": 1.05}


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = ""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        gpu = f"; GPU {out.splitlines()[0]}" if out else ""
    except (OSError, subprocess.SubprocessError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu or 'cpu?'}, {cores} cores{gpu}; Python {platform.python_version()}"


def run_once(kind: str, workload: Path, wargs: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        res = Path(d) / "r.json"
        base = [str(workload), *wargs, "--result", str(res)]
        probe, _, disable = kind.partition(":")
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if probe == "bare":
            cmd = [sys.executable, *base]
        else:
            cmd = [sys.executable, "-m", "torchdoctor", probe, "--steps", "0", "--json",
                   "--timeout", str(timeout), *base]
            if disable:  # "checkup:nan_monitor,memory_sampler": checkup without those
                env["TORCHDOCTOR_DISABLE"] = disable
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
        wall = time.perf_counter() - t0
        if not res.exists():
            raise SystemExit(f"{kind} run failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        out = json.loads(res.read_text())
        out["wall_s"] = wall
        if probe != "bare":
            rep = json.loads(p.stdout)
            out["findings"] = [f["code"] for f in rep["findings"]]
            window = (rep.get("metrics", {}).get("profile") or {}).get("window_cost")
            if window:  # profile: the recorded steps themselves (inside the workload's warm-up)
                out["profile_window"] = window
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="cpu_mlp", help="cpu_mlp | gpu_transformer")
    ap.add_argument("--probe", action="append",
                    help="probe command(s) to compare (default checkup); PROBE:a,b runs PROBE "
                         "without instruments a and b (TORCHDOCTOR_DISABLE), to price them")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", dest="json_out", help="write all samples and the summary here")
    ap.add_argument("wargs", nargs=argparse.REMAINDER, help="-- extra workload arguments")
    a = ap.parse_args()
    probes = a.probe or ["checkup"]
    workload = WORKLOADS / f"{a.workload}.py"
    wargs = [x for x in a.wargs if x != "--"]
    kinds = ["bare", *probes]
    samples: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        order = kinds if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            samples[k].append(run_once(k, workload, wargs, a.timeout))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{k} {samples[k][-1]['step_ms']:.3f} ms" for k in kinds), file=sys.stderr)
    bare = statistics.median(s["step_ms"] for s in samples["bare"])
    bare_cpu = statistics.median(s.get("cpu_step_ms", 0.0) for s in samples["bare"]) or None
    summary = {"machine": machine(), "workload": a.workload, "rounds": a.rounds, "probes": {}}
    print(f"\n{summary['machine']}\nworkload {a.workload}, {a.rounds} alternating rounds\n")
    w = max(10, max(len(k) for k in kinds))
    print(f"{'run':<{w}} {'step ms (median)':>17} {'min':>8} {'max':>8} {'ratio':>7} "
          f"{'cpu ms':>8} {'cpu ratio':>9} {'wall s':>7}")
    for k in kinds:
        steps = [s["step_ms"] for s in samples[k]]
        med = statistics.median(steps)
        ratio = med / bare
        cpu = statistics.median(s.get("cpu_step_ms", 0.0) for s in samples[k])
        cpu_ratio = cpu / bare_cpu if bare_cpu else None
        wall = statistics.median(s["wall_s"] for s in samples[k])
        print(f"{k:<{w}} {med:>17.3f} {min(steps):>8.3f} {max(steps):>8.3f} {ratio:>7.3f} "
              f"{cpu:>8.3f} {cpu_ratio or 0:>9.3f} {wall:>7.2f}")
        summary["probes"][k] = {"step_ms_median": med, "step_ms": steps, "ratio": ratio,
                                "cpu_step_ms_median": cpu, "cpu_ratio": cpu_ratio,
                                "wall_s_median": wall,
                                "findings": samples[k][-1].get("findings")}
        windows = [s["profile_window"] for s in samples[k] if s.get("profile_window")]
        if windows:
            rec = statistics.median(x["recorded_step_ms"] for x in windows)
            unp = statistics.median(x["step_ms"] for x in windows)
            ana = statistics.median(x.get("analysis_s") or 0.0 for x in windows)
            print(f"{'':<{w}} profiler window: recorded steps {rec:.3f} ms vs {unp:.3f} ms "
                  f"un-profiled ({rec / unp:.2f}x), analysis {ana:.2f} s")
            summary["probes"][k]["profile_window"] = {"recorded_step_ms": rec, "step_ms": unp,
                                                      "ratio": rec / unp, "analysis_s": ana}
    budget = BUDGET.get(a.workload)
    ok = True
    if budget and "checkup" in summary["probes"]:
        r = summary["probes"]["checkup"]["ratio"]
        ok = r <= budget
        print(f"\ncheckup step overhead {r:.3f}x (budget {budget:.2f}x): {'OK' if ok else 'OVER'}")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
