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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nonblocking", action="store_true")
    a = ap.parse_args()
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
