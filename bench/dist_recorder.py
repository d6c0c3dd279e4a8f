"""Cost of the collective recorder per torch.distributed call (issue 8 part B).

Runs N small all_reduces on a 1-rank gloo group, alternately bare and through the
recorder's wrapper (the same object the harness installs), and prints the median time per
call of each and the difference. CPU only; the wrapper's cost does not depend on the backend.

    .venv/bin/python bench/dist_recorder.py [N]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from torchdoctor.instruments.dist.dist_collectives import _Recorder


class _Ctx:
    step = 0

    def __init__(self, d: Path):
        self.run_dir = d


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.ones(4)
    with tempfile.TemporaryDirectory() as d:
        rec = _Recorder(_Ctx(Path(d)), torch, dist)
        bare, wrapped = dist.all_reduce, rec.wrap("all_reduce", dist.all_reduce)
        rounds = {"bare": [], "recorded": []}
        for _ in range(7):
            for name, fn in (("bare", bare), ("recorded", wrapped)):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn(x)
                rounds[name].append((time.perf_counter() - t0) / n)
        rec.close()
        lines = sum(1 for _ in open(Path(d) / "collectives.jsonl"))
    b, r = statistics.median(rounds["bare"]), statistics.median(rounds["recorded"])
    print(f"all_reduce(4 floats), 1-rank gloo, {n} calls x 7 rounds: bare {b * 1e6:.1f} us/call, "
          f"recorded {r * 1e6:.1f} us/call, recorder +{(r - b) * 1e6:.1f} us/call "
          f"({lines} lines written)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
