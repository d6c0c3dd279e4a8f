"""NVIDIA GPUs through NVML (nvidia-ml-py): driver, then one bounded collector per GPU.

Without an NVIDIA driver :func:`nvidia` says so plainly (``present: False`` and why); that is
a fact about the machine, not a failure. Each GPU is read in its own thread with its own
timeout, so one sick GPU (NVML calls can hang) costs only its own row. Memory in bytes,
power in watts, temperatures in °C, utilisation in percent (NVML's last sample period).
Fields a GPU does not support are None and named in ``unavailable`` ({field: reason}).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from torchdoctor.envinfo.runner import Collector, describe_exception, is_failed, run_collectors

GPU_TIMEOUT_S = 5.0
# NVML init failures that mean "no usable NVIDIA driver here" (a plain fact, not an error).
NO_DRIVER = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver found (libnvidia-ml.so is not installed)",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to talk to the NVIDIA driver",
}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _reason(e: Exception) -> str:
    name = type(e).__name__
    if name == "NVMLError_NotSupported":
        return "not supported"
    if name == "NVMLError_FunctionNotFound":
        return "not in this driver"
    return describe_exception(e)


def _field(out: dict, unavailable: dict, key: str, fn: Callable[[], Any]) -> None:
    try:
        out[key] = fn()
    except Exception as e:  # noqa: BLE001 - a field a GPU lacks must not lose the others
        out[key] = None
        unavailable[key] = _reason(e)


def cuda_driver_version_str(v: int) -> str:
    """NVML's CUDA driver version 12040 -> "12.4"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def nvidia(gpu_timeout_s: float = GPU_TIMEOUT_S) -> dict:
    """Driver facts and one dict per GPU; ``present`` False (with ``reason``) without a driver."""
    try:
        import pynvml
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py is not installed", "gpus": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        reason = NO_DRIVER.get(type(e).__name__)
        if reason is None:
            raise
        return {"present": False, "reason": reason, "gpus": []}
    out: dict[str, Any] = {"present": True}
    unavailable: dict[str, str] = {}
    _field(out, unavailable, "driver", lambda: _s(pynvml.nvmlSystemGetDriverVersion()))
    _field(out, unavailable, "cuda_driver",
           lambda: cuda_driver_version_str(pynvml.nvmlSystemGetCudaDriverVersion()))
    _field(out, unavailable, "nvml", lambda: _s(pynvml.nvmlSystemGetNVMLVersion()))
    count = pynvml.nvmlDeviceGetCount()
    out["gpu_count"] = count
    results, _ = run_collectors(
        [Collector(f"gpu{i}", (lambda i=i: gpu(pynvml, i)), gpu_timeout_s) for i in range(count)])
    gpus = []
    for i in range(count):
        r = results[f"gpu{i}"]
        gpus.append({"index": i, **r} if is_failed(r) else r)
    out["gpus"] = gpus
    out["unavailable"] = unavailable
    if not any(is_failed(g) for g in gpus):  # never shut NVML down under a thread still inside it
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return out


def _memory(nv, h) -> dict:
    try:  # v2 splits driver-reserved memory out of "used"
        m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        return {"total_bytes": int(m.total), "used_bytes": int(m.used), "free_bytes": int(m.free),
                "reserved_bytes": int(m.reserved)}
    except (nv.NVMLError, AttributeError, TypeError):
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return {"total_bytes": int(m.total), "used_bytes": int(m.used), "free_bytes": int(m.free),
                "reserved_bytes": None}


def _process_name(nv, pid: int) -> str | None:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # noqa: BLE001 - another pid namespace, gone, or no permission
        pass
    try:
        return _s(nv.nvmlSystemGetProcessName(pid))
    except Exception:  # noqa: BLE001
        return None


def _processes(nv, h) -> list[dict]:
    """Processes holding a context on the GPU; ``used_bytes`` None where NVML cannot tell."""
    seen: dict[int, dict] = {}
    me = os.getpid()
    for kind, fn in (("compute", nv.nvmlDeviceGetComputeRunningProcesses),
                     ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses)):
        for p in fn(h):
            used = getattr(p, "usedGpuMemory", None)
            if used is not None and used >= (1 << 63) - 1:  # NVML_VALUE_NOT_AVAILABLE
                used = None
            row = seen.setdefault(p.pid, {"pid": int(p.pid), "name": None, "type": kind,
                                          "used_bytes": used, "self": p.pid == me})
            if row["type"] != kind:
                row["type"] = "compute+graphics"
    for row in seen.values():
        row["name"] = _process_name(nv, row["pid"])
    return sorted(seen.values(), key=lambda r: -(r["used_bytes"] or 0))


def _nvlink(nv, h) -> dict:
    """Links that exist (state readable) and how many are up; raises NotSupported on PCIe-only GPUs."""
    states = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            states.append(bool(nv.nvmlDeviceGetNvLinkState(h, link)))
        except nv.NVMLError as e:
            if not states:
                raise
            if type(e).__name__ in ("NVMLError_NotSupported", "NVMLError_InvalidArgument"):
                break
            raise
    return {"links": len(states), "active": sum(states)}


def _ecc(nv, h) -> dict:
    current, _pending = nv.nvmlDeviceGetEccMode(h)
    out: dict[str, Any] = {"enabled": bool(current)}
    if current:
        for key, et in (("corrected_volatile", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                        ("uncorrected_volatile", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            try:
                out[key] = int(nv.nvmlDeviceGetTotalEccErrors(h, et, nv.NVML_VOLATILE_ECC))
            except nv.NVMLError as e:
                out[key] = None
                out.setdefault("unavailable", {})[key] = _reason(e)
        try:
            corr, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(h)
            out["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc),
                                    "pending": bool(pending), "failure": bool(failure)}
        except nv.NVMLError:
            pass  # only A100/H100-class GPUs remap rows
    return out


def gpu(nv, index: int) -> dict:
    """Everything NVML says about GPU ``index`` that a bug report needs."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    g: dict[str, Any] = {"index": index}
    un: dict[str, str] = {}
    _field(g, un, "name", lambda: _s(nv.nvmlDeviceGetName(h)))
    _field(g, un, "uuid", lambda: _s(nv.nvmlDeviceGetUUID(h)))
    _field(g, un, "pci_bus_id", lambda: _s(nv.nvmlDeviceGetPciInfo(h).busId))
    _field(g, un, "memory", lambda: _memory(nv, h))
    _field(g, un, "compute_capability",
           lambda: "{}.{}".format(*nv.nvmlDeviceGetCudaComputeCapability(h)))

    def util() -> dict:
        u = nv.nvmlDeviceGetUtilizationRates(h)
        return {"gpu_pct": int(u.gpu), "memory_pct": int(u.memory)}

    _field(g, un, "utilization", util)
    _field(g, un, "temperature_c", lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
    _field(g, un, "power_draw_w", lambda: round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1))
    _field(g, un, "power_limit_w", lambda: round(nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, 1))

    def pcie() -> dict:
        return {"gen": int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                "width": int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
                "max_gen": int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                "max_width": int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))}

    _field(g, un, "pcie", pcie)
    _field(g, un, "ecc", lambda: _ecc(nv, h))
    _field(g, un, "nvlink", lambda: _nvlink(nv, h))
    _field(g, un, "persistence_mode", lambda: bool(nv.nvmlDeviceGetPersistenceMode(h)))
    _field(g, un, "mig_mode", lambda: bool(nv.nvmlDeviceGetMigMode(h)[0]))
    _field(g, un, "processes", lambda: _processes(nv, h))
    g["unavailable"] = un
    return g
