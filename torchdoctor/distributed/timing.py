"""Timing an all-reduce the way nccl-tests does: shared by the job-wide sweep of the self-test
(``selftest_worker``) and its per-node sweep (``selftest_nodes``), which call each other's phases.
"""

from __future__ import annotations

import time


def time_all_reduce(dist, torch, x, iters: int, warmup: int, reps: int) -> list[float]:
    """Seconds per all-reduce of ``x``: one value per repetition of ``iters`` calls.

    GPU: CUDA events on the current stream bracket the loop (ProcessGroupNCCL makes the
    current stream wait on its comm stream after each call). CPU: perf_counter (gloo
    calls block until done). A barrier before each repetition aligns the ranks, as
    nccl-tests does.
    """
    cuda = x.is_cuda
    for _ in range(warmup):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                dist.all_reduce(x)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            out.append((time.perf_counter() - t0) / iters)
    return out
