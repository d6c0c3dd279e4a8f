"""Step time of a running job while `torchdoctor attach` samples it, side by side with no attach.

Starts a steady CPU training loop (a small MLP, one torch thread, a timestamp printed per step),
then alternates windows: WINDOW s with nothing attached, then the whole life of one `torchdoctor
attach PID --duration WINDOW` process (its start-up and report included: on a small box they
compete with the target for CPU too; blocking py-spy dumps, the default; ``--nonblocking`` to
compare), for ``--rounds`` rounds. Prints per window the median and mean step time and the
slowest step (a blocking dump pauses the target for a moment: the slowest step shows it), and per
round the ratio attached/plain of the median step times (paired: neighbours on a shared box slow
both windows of a round alike), then the median of those ratios.

    python bench/attach_overhead.py [--window 10] [--rounds 3] [--nonblocking]
    python bench/attach_overhead.py --pause [--dumps 20]   # the pause one py-spy dump causes

``--pause``: a pure-Python loop that reports every gap between two of its iterations longer than
2 ms; py-spy dumps it ``--dumps`` times, blocking then non-blocking, and the gaps seen during the
dumps are compared with those of an equal stretch without dumps (the box's own scheduling gaps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def pause(dumps: int) -> int:
    from torchdoctor.attach.sampler import dump, require_pyspy

    binary = require_pyspy()
    target = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    gaps: list[tuple[float, float]] = []
    threading.Thread(target=lambda: [gaps.append(tuple(map(float, ln.split()))) for ln in target.stdout],
                     daemon=True).start()
    time.sleep(1.0)
    try:
        spans = []
        for mode in ("none", "blocking", "non-blocking"):
            t0 = time.perf_counter()
            for _ in range(dumps):
                if mode == "none":
                    time.sleep(0.3)
                else:
                    d = dump(binary, target.pid, 30, nonblocking=mode == "non-blocking")
                    assert "threads" in d, d
            spans.append((mode, t0, time.perf_counter()))
    finally:
        target.kill()
        target.wait()
    print(f"{dumps} dumps per mode, load {os.getloadavg()[0]:.1f}; gaps > 2 ms in the spinning target")
    for mode, t0, t1 in spans:
        g = [ms for t, ms in gaps if t0 <= t <= t1]
        top = sorted(g)[-3:]
        print(f"{mode:<13} {t1 - t0:6.1f} s  gaps {len(g):4d}  total {sum(g):7.1f} ms  "
              f"largest {', '.join(f'{x:.1f}' for x in top)} ms")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nonblocking", action="store_true")
    ap.add_argument("--pause", action="store_true")
    ap.add_argument("--dumps", type=int, default=20)
    a = ap.parse_args()
    if a.pause:
        return pause(a.dumps)
    target = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    stamps: list[float] = []

    def read() -> None:
        for line in target.stdout:
            stamps.append(float(line))

    threading.Thread(target=read, daemon=True).start()
    while len(stamps) < 50:  # imports done, warmed up
        time.sleep(0.2)
    windows: list[tuple[str, float, float]] = []
    try:
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            time.sleep(a.window)
            windows.append(("plain", t0, time.perf_counter()))
            cmd = [sys.executable, "-m", "torchdoctor", "attach", str(target.pid), "--duration",
                   f"{a.window:g}", "--json", *(["--nonblocking"] if a.nonblocking else [])]
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            p.wait()
            windows.append(("attached", t0, time.perf_counter()))
    finally:
        target.kill()
        target.wait()
    print(f"window {a.window:g} s, {a.rounds} rounds, "
          f"{'non-blocking' if a.nonblocking else 'blocking'} dumps, load {os.getloadavg()[0]:.1f}")
    print(f"{'window':<9} {'steps':>6} {'median ms':>10} {'mean ms':>8} {'max ms':>8}")
    med: dict[str, list[float]] = {"plain": [], "attached": []}
    for kind, t0, t1 in windows:
        ts = [t for t in stamps if t0 <= t <= t1]
        steps = [(b - c) * 1e3 for c, b in zip(ts, ts[1:])]
        if len(steps) < 3:
            continue
        med[kind].append(statistics.median(steps))
        print(f"{kind:<9} {len(steps):>6} {statistics.median(steps):>10.2f} "
              f"{statistics.fmean(steps):>8.2f} {max(steps):>8.1f}")
    ratios = [b / a for a, b in zip(med["plain"], med["attached"])]
    if ratios:
        r = statistics.median(ratios)
        print("per round attached/plain: " + ", ".join(f"{x:.3f}" for x in ratios))
        print(f"median ratio {r:.3f} ({(r - 1) * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
