"""Where the ``nan`` probe's per-step cost goes on one workload: host vs device.

In one process (one model), alternating: the bare step, and the step under the ``nan`` probe's
instruments. For each it prints wall ms/step and host CPU ms/step (``thread_time``: when it
is close to the wall time, the loop is host-bound and every host microsecond the hooks add is
a microsecond of step). Under ``nan`` it also prints the host time spent inside the numerics
monitor's hooks per step (timed wrappers), how many module calls and reductions a step makes,
a cProfile of the steps (own host time per function, ``--cprofile N``), the peak allocated
CUDA memory of each configuration (what the monitor's held references cost), and, from a
short ``torch.profiler`` window, the device time of the monitor's reduction kernels against
the step's total kernel time. ``--probe checkup`` times ``checkup``'s instruments instead.

    python bench/nan_breakdown.py --workload gpu-transformer [--rounds 3]
    python bench/nan_breakdown.py --workload cpu-mlp --probe checkup --steps 300
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

HOOKS = ("_fwd_pre", "_fwd_post", "_record", "_flush", "_pre_step", "_close_row",
         "on_backward_begin", "_maybe_read", "_read")


def _timed_block(step, n: int) -> tuple[float, float, float, float]:
    """(wall ms/step, host CPU ms/step, peak allocated MiB on CUDA else 0, share of step
    starts at which the GPU had already finished everything queued: the host was behind)."""
    import torch

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        evs = [torch.cuda.Event(), torch.cuda.Event()]
    idle = 0
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        if cuda:
            if i and evs[(i - 1) % 2].query():
                idle += 1
            step()
            evs[i % 2].record()
        else:
            step()
    sync()
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
    return ((time.perf_counter() - t0) / n * 1e3, (time.thread_time() - c0) / n * 1e3, peak,
            idle / max(1, n - 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpu-transformer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--cprofile", type=int, default=25, metavar="N",
                    help="print the N functions with the most own host time under the probe "
                         "(0: off)")
    ap.add_argument("--probe", default="nan", help="the probe whose instruments are timed "
                    "(nan, or checkup to see the light instruments' cost)")
    a = ap.parse_args()
    import nan_overhead
    import torch

    from torchdoctor.pipeline.registry import instruments_for
    from torchdoctor.instruments.nan.nan_monitor import NanMonitor
    from torchdoctor.runner.context import HarnessContext
    from torchdoctor.runner.core import Core
    from torchdoctor.runner.rundir import EvidenceWriter

    from hooktimers import HookTimers

    step, _sync = nan_overhead.build_workload(a.workload, "nan_breakdown_workload")
    for _ in range(10):
        step()
    timers = HookTimers()

    def under_nan(fn, timing=False, options=None):
        if timing:
            timers.wrap(NanMonitor, HOOKS)
        d = tempfile.mkdtemp(prefix="td-nanbd-")
        ctx = HarnessContext(a.probe, d, {"steps": 0, **(options or {})}, EvidenceWriter(d))
        core = Core(ctx, [c() for c in instruments_for(a.probe)])
        core.install()
        try:
            for _ in range(3):  # discovery steps (global hooks) before timing
                step()
            return fn(), core
        finally:
            core.uninstall()
            ctx._writer.close()
            timers.restore()

    configs = {"bare": None, a.probe: {}, f"{a.probe}-nowatch": {"forward_watch": False}}
    res: dict[str, list] = {k: [] for k in configs}
    for _ in range(a.rounds):
        for k, opts in configs.items():
            if opts is None:
                res[k].append(_timed_block(step, a.steps))
            else:
                res[k].append(under_nan(lambda: _timed_block(step, a.steps), options=opts)[0])
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"workload {a.workload}: {gpu}, torch {torch.__version__}")
    base = statistics.median(x[0] for x in res["bare"])
    for k, xs in res.items():
        w = statistics.median(x[0] for x in xs)
        c = statistics.median(x[1] for x in xs)
        peak = max(x[2] for x in xs)
        idle = statistics.median(x[3] for x in xs)
        print(f"{k:<13} wall {w:8.3f} ms/step  host CPU {c:8.3f} ms/step  x bare {w / base:5.3f}"
              f"  peak allocated {peak:9.1f} MiB  GPU idle at step start {idle:4.0%}")

    # host time inside the monitor's hooks (timed wrappers add ~0.3 us a call)
    def timed_after_discovery():
        timers.clear()
        return _timed_block(step, a.steps)

    under_nan(timed_after_discovery, timing=True)
    n = a.steps
    acc, cnt = timers.acc, timers.cnt
    print("host time in the numerics monitor per step (ms), calls per step:")
    for k in sorted(acc, key=lambda k: -acc[k]):
        h = k.split(".", 1)[1]
        print(f"  {h:<18} {acc[k] / n * 1e3:8.3f} ms  {cnt[k] / n:7.1f} calls")

    if a.cprofile:
        import cProfile
        import io
        import pstats

        def cprof():
            pr = cProfile.Profile()
            pr.enable()
            _timed_block(step, a.steps)
            pr.disable()
            return pr

        pr, _core = under_nan(cprof)
        for title, sort, restrict in (("own time", "tottime", ()),
                                      ("torchdoctor's functions by cumulative time", "cumulative",
                                       ("torchdoctor",))):
            buf = io.StringIO()
            pstats.Stats(pr, stream=buf).sort_stats(sort).print_stats(*restrict, a.cprofile)
            print(f"cProfile of {a.steps} steps under {a.probe}, {title} (the deterministic "
                  f"profiler slows Python calls):")
            lines = buf.getvalue().splitlines()
            head = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
            print("\n".join(line for line in lines[head:] if line.strip()))

    # device time per kernel in a profiled window of 3 steps, bare and under the probe
    from torch.profiler import ProfilerActivity, profile

    def prof():
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=acts) as p:
            for _ in range(3):
                step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        by: dict[str, float] = collections.defaultdict(float)
        for e in p.key_averages():
            dt = getattr(e, "self_device_time_total", None)
            if dt is None:
                dt = getattr(e, "self_cuda_time_total", 0.0)
            # kernels only: not aten ops (their device time is their kernels') nor annotations
            if e.key.startswith("aten::") or "#" in e.key or not dt:
                continue
            by[e.key] += dt / 3 / 1e3  # ms per step
        return by

    bare_k = prof()
    probe_k, _core = under_nan(prof)
    tb, tp = sum(bare_k.values()), sum(probe_k.values())
    mm = sum(v for k, v in probe_k.items() if "minmax" in k.lower())
    ln = sum(v for k, v in probe_k.items() if "lpnorm" in k.lower())
    print(f"device kernel time per step: bare {tb:.3f} ms, {a.probe} {tp:.3f} ms "
          f"(+{tp - tb:.3f}); in {a.probe}: *minmax* kernels {mm:.3f} ms, *LpNorm* (fused "
          f"forward checks + gradient norms) {ln:.3f} ms")
    print(f"kernels with the largest added device time per step under {a.probe}:")
    delta = {k: probe_k.get(k, 0.0) - bare_k.get(k, 0.0) for k in set(bare_k) | set(probe_k)}
    for k, v in sorted(delta.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {v:+8.3f} ms  {k[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
