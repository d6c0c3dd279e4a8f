"""Step time of a running job while `torchdoctor attach` samples it, side by side with no attach.

One run, two parts (about 2.5 minutes with the defaults on a machine with free cores):

1. **Step time.** Starts a steady CPU training loop (a small MLP, one torch thread, a timestamp
   printed per step), then per round: WINDOW s with nothing attached, the whole life of one
   `torchdoctor attach PID --duration WINDOW` with blocking dumps (the default), WINDOW s plain
   again, one attach with `--nonblocking`. Each attached window is paired with the plain window
   just before it (neighbours on a shared box slow both alike): per pair the ratio attached/plain
   of the median step times, then per mode the median of those ratios. The attach's life includes
   its start-up and report (on a box without a free core they compete with the target for CPU
   too), the 5 stack dumps, the GIL record and the RSS/NVML samples.
2. **Pause.** A pure-Python loop that reports every gap between two of its iterations longer than
   2 ms; py-spy dumps it DUMPS times blocking, then non-blocking, and the gaps seen during the
   dumps are set against an equal stretch without dumps (the box's own scheduling gaps): what one
   dump costs the target, separately from the CPU the attach process uses.

    python bench/attach_overhead.py [--window 6] [--rounds 4] [--dumps 10] [--json FILE]

With OUT set in the environment the results are also written to $OUT/attach_overhead.json. The
JSON's ``recommendation`` says which dump mode kept the median step time within 5 % (blocking
first: its stacks are consistent snapshots); it is a measured statement, not a setting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOUND = 1.05  # the bound: at most 5 % slower while sampled
MODES = ("blocking", "nonblocking")
LOOP = r'''
import sys, time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(64, 256)
while True:
    loss = m(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    print(time.perf_counter(), flush=True)
'''

SPIN = r'''
import time
last = time.perf_counter()
while True:
    t = time.perf_counter()
    if t - last > 0.002:
        print(f"{t} {(t - last) * 1e3:.2f}", flush=True)
    last = t
'''


def window_stats(stamps: list[float], t0: float, t1: float) -> dict | None:
    """Step times (ms) of the steps that ended inside [t0, t1]: None with fewer than 3."""
    ts = [t for t in stamps if t0 <= t <= t1]
    steps = sorted((b - a) * 1e3 for a, b in zip(ts, ts[1:]))
    if len(steps) < 3:
        return None
    return {"steps": len(steps), "median_ms": round(statistics.median(steps), 4),
            "mean_ms": round(statistics.fmean(steps), 4),
            "p99_ms": round(steps[min(len(steps) - 1, int(0.99 * len(steps)))], 3),
            "max_ms": round(steps[-1], 3), "seconds": round(t1 - t0, 2)}


def summarise(windows: list[tuple[str, float, float]], stamps: list[float]) -> dict:
    """Windows in run order ("plain", "blocking", "plain", "nonblocking", ...) → per mode the
    ratios of each attached window to the plain window just before it, and their median."""
    out: dict = {"windows": [], "modes": {}}
    last_plain: dict | None = None
    for kind, t0, t1 in windows:
        st = window_stats(stamps, t0, t1)
        out["windows"].append({"kind": kind, **(st or {"steps": 0})})
        if kind == "plain":
            last_plain = st
            continue
        m = out["modes"].setdefault(kind, {"ratios": []})
        if st and last_plain:
            m["ratios"].append(round(st["median_ms"] / last_plain["median_ms"], 4))
        last_plain = None
    for m in out["modes"].values():
        r = m["ratios"]
        m["median_ratio"] = round(statistics.median(r), 4) if r else None
        m["within_bound"] = bool(r) and statistics.median(r) <= BOUND
    return out


def recommend(modes: dict) -> str:
    for mode in MODES:
        if (modes.get(mode) or {}).get("within_bound"):
            return mode
    return "neither within 5 %"


def step_time(window: float, rounds: int) -> dict:
    target = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    stamps: list[float] = []
    threading.Thread(target=lambda: [stamps.append(float(ln)) for ln in target.stdout], daemon=True).start()
    deadline = time.monotonic() + 120
    while len(stamps) < 200 and time.monotonic() < deadline:  # imports done, warmed up
        time.sleep(0.2)
    windows: list[tuple[str, float, float]] = []
    attach_s: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for _ in range(rounds):
            for mode in MODES:
                t0 = time.perf_counter()
                time.sleep(window)
                windows.append(("plain", t0, time.perf_counter()))
                cmd = [sys.executable, "-m", "torchdoctor", "attach", str(target.pid), "--duration",
                       f"{window:g}", "--json", *(["--nonblocking"] if mode == "nonblocking" else [])]
                t0 = time.perf_counter()
                p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True, timeout=window + 120)
                t1 = time.perf_counter()
                if p.returncode not in (0, 1) or '"command": "attach"' not in p.stdout:
                    raise SystemExit(f"attach failed (exit {p.returncode}): {p.stdout[-500:]}")
                windows.append((mode, t0, t1))
                attach_s[mode].append(round(t1 - t0, 2))
    finally:
        target.kill()
        target.wait()
    res = summarise(windows, stamps)
    for mode in MODES:
        res["modes"].setdefault(mode, {})["attach_life_s"] = attach_s[mode]
    return res


def pause(dumps: int) -> dict:
    from torchdoctor.attach.sampler import dump, require_pyspy

    binary = require_pyspy()
    target = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    gaps: list[tuple[float, float]] = []
    threading.Thread(target=lambda: [gaps.append(tuple(map(float, ln.split()))) for ln in target.stdout],
                     daemon=True).start()
    time.sleep(1.0)
    spans, reads = [], {}
    try:
        for mode in ("none", "blocking", "nonblocking"):
            t0, took = time.perf_counter(), []
            for _ in range(dumps):
                if mode == "none":
                    time.sleep(0.3)
                else:
                    d = dump(binary, target.pid, 30, nonblocking=mode == "nonblocking")
                    if "threads" not in d:
                        raise SystemExit(f"py-spy dump failed: {d}")
                    took.append(d["read_s"])
                    time.sleep(0.05)
            spans.append((mode, t0, time.perf_counter()))
            reads[mode] = took
    finally:
        target.kill()
        target.wait()
    out = {}
    for mode, t0, t1 in spans:
        g = sorted(ms for t, ms in gaps if t0 <= t <= t1)
        out[mode] = {"seconds": round(t1 - t0, 2), "gaps": len(g), "gap_total_ms": round(sum(g), 1),
                     "largest_ms": g[-3:], "dumps": 0 if mode == "none" else dumps,
                     "dump_s_median": round(statistics.median(reads[mode]), 3) if reads.get(mode) else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dumps", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    started = time.monotonic()
    load0 = os.getloadavg()
    res = {"bench": "attach_overhead", "host": platform.node(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "window_s": a.window, "rounds": a.rounds,
           "load_before": [round(x, 2) for x in load0]}
    res["step_time"] = step_time(a.window, a.rounds)
    res["pause"] = pause(a.dumps)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    res["recommendation"] = recommend(res["step_time"]["modes"])
    res["wall_s"] = round(time.monotonic() - started, 1)

    print(f"window {a.window:g} s, {a.rounds} rounds, {os.cpu_count()} CPUs, load "
          f"{load0[0]:.1f} -> {res['load_after'][0]:.1f}, {res['wall_s']:.0f} s")
    print(f"{'window':<12} {'steps':>6} {'median ms':>10} {'mean ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for w in res["step_time"]["windows"]:
        if w["steps"]:
            print(f"{w['kind']:<12} {w['steps']:>6} {w['median_ms']:>10.3f} {w['mean_ms']:>8.3f} "
                  f"{w['p99_ms']:>8.2f} {w['max_ms']:>8.1f}")
    for mode, m in res["step_time"]["modes"].items():
        r = m.get("median_ratio")
        print(f"{mode}: attached/plain per round {', '.join(f'{x:.3f}' for x in m.get('ratios', []))}; "
              f"median {'-' if r is None else f'{r:.3f} ({(r - 1) * 100:+.1f}%)'}; "
              f"attach life {m.get('attach_life_s')} s")
    for mode, p in res["pause"].items():
        print(f"pause {mode:<12} {p['seconds']:5.1f} s, gaps > 2 ms: {p['gaps']:4d}, total "
              f"{p['gap_total_ms']:7.1f} ms, largest {p['largest_ms']} ms, dump {p['dump_s_median']} s")
    print(f"recommendation: {res['recommendation']}")
    text = json.dumps(res, indent=1) + "\n"
    targets = [a.json] if a.json else []
    if os.environ.get("OUT"):
        targets.append(os.path.join(os.environ["OUT"], "attach_overhead.json"))
    for path in targets:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        Path(path).write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
