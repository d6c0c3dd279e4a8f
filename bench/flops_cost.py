"""What counting one step's FLOPs costs (instruments/perf/flop_count.py), on a small CPU model.

    .venv/bin/python bench/flops_cost.py [--width 256] [--reps 40]

Times a plain training step (MLP, Adam, 1 thread) against the same step under the counter
(``make_counter``: torch's FlopCounterMode with the module tracker stubbed out), and the first
counted step of a process (one-time set-up inside the step), in medians; reports the aten ops per
step and the cost per op. Also with torch's own module tracker, for comparison. Prints one JSON
line. The numbers in docs/yardstick.md come from here (machine named there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--reps", type=int, default=40)
    a = ap.parse_args()
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    from torchdoctor.instruments.perf.flop_count import _Tally, counting_mapping, make_counter

    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = a.width
    m = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, 10))
    opt = torch.optim.Adam(m.parameters())
    x, y = torch.randn(64, w), torch.randint(0, 10, (64,))

    def step() -> float:
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.n += 1
            return func(*args, **(kwargs or {}))

    def counted(tracker: bool) -> float:
        c = FlopCounterMode(display=False, custom_mapping=counting_mapping(_Tally())) if tracker \
            else make_counter(_Tally())
        with c:
            return step()

    for _ in range(5):
        step()
    first = counted(False)
    with Ops():
        step()
    bare, ours, torchs = [], [], []
    for _ in range(a.reps):  # interleaved: the box's load hits all three alike
        bare.append(step())
        ours.append(counted(False))
        torchs.append(counted(True))
    b, o, t = (statistics.median(v) for v in (bare, ours, torchs))
    print(json.dumps({
        "width": w, "reps": a.reps, "torch": torch.__version__, "ops_per_step": Ops.n,
        "bare_step_ms": round(b * 1e3, 3), "counted_step_ms": round(o * 1e3, 3),
        "ratio": round(o / b, 2), "per_op_us": round((o - b) / Ops.n * 1e6, 1),
        "first_counted_step_ms": round(first * 1e3, 2),
        "with_torch_module_tracker_ratio": round(t / b, 2)}))


if __name__ == "__main__":
    main()
