"""Does a py-spy dump's own wake leak into the window between dumps? (attach's "blocked for good")

A process whose main thread waits for good (``threading.Event().wait()``) is dumped every 0.5 s
while N busy processes load the box; for each window between two dumps the main thread's context
switches are counted as ``attach`` counts them (``torchdoctor.attach.session._dump``): once with
the post-dump settle and once without it (``SETTLE_READS = 0``). A blocked thread should show 0
in every window.

    .venv/bin/python bench/attach_wakes.py [--busy 0,4,8] [--dumps 12]

Needs py-spy (``.venv/bin/py-spy`` or on PATH) and ptrace rights over a child.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchdoctor.attach import session  # noqa: E402


def windows(binary: str, busy: int, dumps: int, settle: bool) -> list[int]:
    target = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    saved = session.SETTLE_READS
    session.SETTLE_READS = saved if settle else 0
    try:
        time.sleep(1.0)
        out, prev = [], None
        for _ in range(dumps):
            d = session._dump(binary, target.pid, 10.0, False, False)
            if prev is not None and "main_before" in d:
                out.append(d["main_before"]["switches"] - prev["main_after"]["switches"])
            prev = d
            time.sleep(0.5)
        return out
    finally:
        session.SETTLE_READS = saved
        for p in load + [target]:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", default="0,4,8")
    ap.add_argument("--dumps", type=int, default=12)
    args = ap.parse_args()
    binary = str(Path(sys.executable).with_name("py-spy")) if Path(sys.executable).with_name(
        "py-spy").exists() else shutil.which("py-spy")
    if not binary:
        sys.exit("py-spy not found")
    print("busy  settle  windows with a switch / windows   switches per window")
    for busy in [int(b) for b in args.busy.split(",")]:
        for settle in (False, True):
            w = windows(binary, busy, args.dumps, settle)
            print(f"{busy:4d}  {'yes' if settle else 'no':6s}  {sum(1 for x in w if x):3d} / {len(w):3d}"
                  f"                      {w}")


if __name__ == "__main__":
    main()
