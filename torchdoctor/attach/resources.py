"""Host RSS (psutil) and, where NVML answers, GPU utilisation and memory of each process.

Read-only counters of the kernel and the driver: the target is not touched. NVML's per-process
view (``nvmlDeviceGetComputeRunningProcesses``) gives each PID's memory on each GPU; utilisation
and power are per GPU (NVML has no per-process utilisation that every driver fills), so each
process is given the GPUs it holds memory on.
"""

from __future__ import annotations

import time


def rss(pid: int) -> dict:
    """{"rss": bytes, "status": psutil status} or {"status": "gone"}."""
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return {"rss": p.memory_info().rss, "status": p.status(), "cpu": p.cpu_times().user}
    except psutil.NoSuchProcess:
        return {"status": "gone"}
    except psutil.AccessDenied:
        return {"status": "denied"}


def main_thread_counters(pid: int) -> dict | None:
    """How often the process's main thread (task ``pid``) has been switched out, and its CPU time
    in ns (``schedstat``, absent on kernels without it): read before and after each stack dump, so
    that the wakes *between* dumps tell a thread blocked for good (none) from one that runs. A
    blocking dump itself wakes a sleeping thread twice (measured: 10 switches for 5 dumps of a
    thread blocked in a futex, 0 without dumps), which is why the dumps' own spans are left out.
    None when /proc cannot be read (the process ended, another user's)."""
    base = f"/proc/{pid}/task/{pid}"
    try:
        with open(f"{base}/status") as f:
            switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    except (OSError, ValueError, IndexError):
        return None
    cpu_ns = None
    try:
        with open(f"{base}/schedstat") as f:
            cpu_ns = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return {"switches": switches, "cpu_ns": cpu_ns}


def host_available() -> int | None:
    import psutil

    try:
        return int(psutil.virtual_memory().available)
    except (OSError, AttributeError):
        return None


class Gpus:
    """NVML per process; ``available`` False (with ``reason``) without a driver."""

    def __init__(self) -> None:
        self.available = False
        self.reason = ""
        self._handles: list = []
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self.available = n > 0
            self.reason = "" if n else "no NVIDIA GPU"
        except Exception as e:  # noqa: BLE001 - no driver, no library: not measured, said why
            self.reason = f"NVML unavailable ({type(e).__name__})"

    def sample(self, pids: set[int]) -> dict:
        """{pid: [{"gpu", "mem", "util", "power_w"}]} for the PIDs found on a GPU."""
        if not self.available:
            return {}
        import pynvml

        out: dict[int, list[dict]] = {}
        for i, h in enumerate(self._handles):
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # noqa: BLE001
                continue
            mine = [p for p in procs if p.pid in pids]
            if not mine:
                continue
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
            except Exception:  # noqa: BLE001
                util = None
            try:
                power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception:  # noqa: BLE001
                power = None
            for p in mine:
                out.setdefault(p.pid, []).append(
                    {"gpu": i, "mem": getattr(p, "usedGpuMemory", None), "util": util,
                     "power_w": power})
        return out


def snapshot(pids: list[int], gpus: Gpus) -> dict:
    t = time.time()
    gpu = gpus.sample(set(pids))
    return {"t": t, "procs": {str(p): {**rss(p), "gpu": gpu.get(p, [])} for p in pids}}
