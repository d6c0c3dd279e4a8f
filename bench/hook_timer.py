"""Per-hook host time of a probe's instruments, in one process, on a CPU workload.

Wraps every instrument callback and hook of PROBE (methods named ``_pre*``, ``_post*``,
``on_*``, ``_fwd*``, ``opt_*``, ``mod_*``), the core's hooks, the evidence writer and the memory
sampler's parts with ``perf_counter`` timers, runs the ``bench/nan_overhead.py`` workload bare
and then under the probe, and prints µs per step for each (nested timings overlap: a
callback's time includes the helpers it calls). It also says whether the memory sampler's
allocation-site window opened (a one-off cost of ~0.5 s on this box).

    python bench/hook_timer.py --probe checkup [--workload cpu-mlp] [--steps 2000]
    python bench/hook_timer.py --probe checkup --script bench/workloads/cpu_mlp.py \
        --steps 600 --warmup 20 --result /tmp/r.json      # a whole script, run in-process

With ``--script``, the script runs (``runpy``, its remaining arguments passed on) once bare
and once under the probe, and the timings are divided by the steps the step clock counted;
bench workloads also print the ``step_ms`` they measured themselves.
"""

from __future__ import annotations

import argparse
import collections
import json
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", default="checkup")
    ap.add_argument("--workload", default="cpu-mlp")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--script", default=None, help="run this script instead of a workload")
    a, rest = ap.parse_known_args()
    if a.script is not None:
        rest = ["--steps", str(a.steps), *rest]
    import nan_overhead

    from torchdoctor.instruments import all_instruments
    from torchdoctor.pipeline.registry import instruments_for
    from torchdoctor.instruments.memory import memory_sampler as ms
    from torchdoctor.memory import host
    from torchdoctor.runner.context import HarnessContext
    from torchdoctor.runner.core import Core
    from torchdoctor.runner.rundir import EVENTS, EvidenceWriter

    from hooktimers import HookTimers

    if a.script is None:
        step, sync = nan_overhead.build_workload(a.workload, "hook_timer_workload")
        for _ in range(50):
            step()

    timers = HookTimers()
    armed = instruments_for(a.probe)
    for cls in all_instruments().values():
        if cls in armed:
            timers.wrap(cls, [n for n in vars(cls)
                              if n.startswith(("_pre", "_post", "on_", "_fwd", "opt_", "mod_"))])
    timers.wrap(Core, ["_opt_pre", "_opt_post", "_boundary", "_bwd_begin", "_bwd_end", "_root_pre",
                       "_root_post", "_g_fwd_pre", "_g_fwd_post"])
    timers.wrap(EvidenceWriter, ["write"])
    timers.wrap(ms.MemorySampler, ["_window_tick", "_refresh_devices", "_finish_window"])
    timers.wrap(host.HeapCounter, ["read"])

    def timed(n):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        return (time.perf_counter() - t) / n * 1e6

    def run_script() -> str:
        argv = sys.argv
        sys.argv = [a.script, *rest]
        t = time.perf_counter()
        try:
            runpy.run_path(a.script, run_name="__main__")
        finally:
            sys.argv = argv
        res = ""
        if "--result" in rest:
            res = Path(rest[rest.index("--result") + 1]).read_text()
        return f"{time.perf_counter() - t:.2f} s {res}"

    if a.script is None:
        bare = f"{statistics.median(timed(a.steps // 4) for _ in range(3)):.1f} us/step"
    else:
        bare = run_script()
    d = tempfile.mkdtemp(prefix="td-hooktimer-")
    writer = EvidenceWriter(d)
    ctx = HarnessContext(a.probe, d, {"steps": 0}, writer)
    core = Core(ctx, [c() for c in instruments_for(a.probe)])
    core.install()
    try:
        if a.script is None:
            for _ in range(20):
                step()
            timers.clear()
            under = f"{timed(a.steps):.1f} us/step"
        else:
            under = run_script()
    finally:
        core.uninstall()
        writer.close()
        timers.restore()
    n = a.steps if a.script is None else max(1, ctx.step)
    print(f"{a.script or 'workload ' + a.workload}: bare {bare}; under {a.probe} with the "
          f"timers {under}")
    print("\n".join(timers.lines(n)))
    events = [json.loads(line) for line in open(Path(d) / EVENTS)]
    kinds = collections.Counter(e["kind"] for e in events)
    print("events per step:", {k: round(v / n, 2) for k, v in kinds.items() if v >= n / 2})
    print("allocation-site window opened:", any(e["kind"] == "mem_sites" for e in events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
