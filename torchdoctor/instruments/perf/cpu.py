"""CPU contention: intra-op threads vs the cores this process may use, and the host's load.

At the end of the first step (after the script's own ``torch.set_num_threads``) and at the
end of the run it records: torch's intra-op thread count, the usable cores (affinity mask,
capped by a cgroup CPU quota), ``LOCAL_WORLD_SIZE`` processes on the host, the main thread's
CPU time (``time.thread_time``) and wall time over the judged steps, and the CPU time the
whole host and this process tree used in that window (``/proc/stat``, psutil) — the
difference is the neighbours' load — and, per thread of this process, the time spent
runnable but waiting for a CPU (``/proc/self/task/*/schedstat``: the scheduler's own
run-queue delay, so a thread that sleeps or waits on I/O is not "starved"). Cost: two
``thread_time`` reads per step; the ``/proc`` and psutil reads happen twice per run.
Event: ``cpu`` at the end.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from torchdoctor.instruments.base import Instrument, register


def usable_cores() -> dict[str, Any]:
    aff = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = None
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            q, period = f.read().split()[:2]
        if q != "max":
            quota = float(q) / float(period)
    except (OSError, ValueError):
        pass
    cores = aff if quota is None else min(aff, max(1, math.ceil(quota)))
    return {"affinity": aff, "cgroup_quota": quota, "cores": cores, "logical_cpus": os.cpu_count()}


def _host_busy_s() -> float | None:
    """Busy CPU seconds of the whole host since boot (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
        vals = [int(x) for x in parts[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return (sum(vals[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _runqueue_ns() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for a CPU) summed over this process's threads."""
    run = wait = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    seen = False
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                a, b = f.read().split()[:2]
            run, wait, seen = run + int(a), wait + int(b), True
        except (OSError, ValueError):
            continue
    return (run, wait) if seen else None


def _tree_cpu_s() -> float | None:
    try:
        import psutil

        p = psutil.Process()
        total = sum(p.cpu_times()[:2])
        for c in p.children(recursive=True):
            try:
                total += sum(c.cpu_times()[:2])
            except psutil.Error:
                pass
        return total
    except Exception:  # noqa: BLE001
        return None


@register
class CpuContention(Instrument):
    name = "cpu"
    produces = frozenset({"cpu"})
    priority = 70

    def install(self, ctx: Any) -> None:
        self.t0 = self.cpu0 = None
        self.t1 = self.cpu1 = None
        self.host0 = self.tree0 = self.rq0 = None
        self.threads = None

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.t0 is not None and step & 7 and step > 16:
            return  # the window's end is read every 8 steps (two clock reads cost ~10 us cold)
        now, cpu = time.perf_counter(), time.thread_time()
        if self.t0 is None:
            import torch

            self.threads = torch.get_num_threads()
            self.host0, self.tree0 = _host_busy_s(), _tree_cpu_s()
            self.rq0 = _runqueue_ns()
            self.t0, self.cpu0, self.step0 = time.perf_counter(), time.thread_time(), step
        else:
            self.t1, self.cpu1, self.step1 = now, cpu, step

    def uninstall(self, ctx: Any) -> None:
        info: dict[str, Any] = usable_cores()
        torch_threads = self.threads
        if torch_threads is None:
            try:
                import torch

                torch_threads = torch.get_num_threads()
            except Exception:  # noqa: BLE001
                pass
        info["torch_threads"] = torch_threads
        lws = os.environ.get("LOCAL_WORLD_SIZE")
        info["local_processes"] = int(lws) if lws and lws.isdigit() else 1
        if self.t0 is not None and self.t1 is not None and self.t1 > self.t0:
            wall = self.t1 - self.t0
            info.update(window_steps=[self.step0 + 1, self.step1], window_s=round(wall, 4),
                        main_thread_cpu_s=round(self.cpu1 - self.cpu0, 4))
            host1, tree1, t2 = _host_busy_s(), _tree_cpu_s(), time.perf_counter()
            rq1 = _runqueue_ns()
            if self.rq0 is not None and rq1 is not None:
                run_s, wait_s = (rq1[0] - self.rq0[0]) / 1e9, (rq1[1] - self.rq0[1]) / 1e9
                info.update(threads_on_cpu_s=round(run_s, 4), threads_runqueue_wait_s=round(wait_s, 4))
            span = t2 - self.t0
            if None not in (self.host0, host1, self.tree0, tree1) and span > 0:
                host_cores = (host1 - self.host0) / span
                tree_cores = (tree1 - self.tree0) / span
                info.update(host_busy_cores=round(host_cores, 3),
                            own_cores=round(tree_cores, 3),
                            other_load_cores=round(max(0.0, host_cores - tree_cores), 3),
                            host_window_s=round(span, 4))
        try:
            info["loadavg_1m"] = round(os.getloadavg()[0], 2)
        except OSError:
            pass
        ctx.emit("cpu", **info)
