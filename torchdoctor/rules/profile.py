"""Performance rules of the ``profile`` probe: judgment on the profiler window's evidence.

Inputs: the ``profile_*`` events of :mod:`torchdoctor.instruments.profile.profiler_window` and the step
clock's ``step`` events. Device figures are judged against the *un-profiled* step time (median
wall time of the steps the window did not touch), because the profiler's Python tracer slows the
host during the recorded steps but not the device. The thresholds are the constants declared
with each code below (why these values: ``docs/findings/<code>.md``).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.evidence.profile import bare_clock as measured_clock
from torchdoctor.evidence.profile import not_reached
from torchdoctor.findings import Finding, finding, internal_finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.perf_step import DATA_SHARE
from torchdoctor.skills import MIXED_PRECISION, PERFORMANCE

PROBES = {"profile"}
LAUNCH_BUSY_MAX = 0.5  # launch-bound: GPU busy below this share of the step ...
# ... while the data wait stays below dataloader-bound's DATA_SHARE (else the GPU waits for data)
PAGEABLE_MIN_BYTES = 256 * 1024  # pageable H2D per step worth a warning ...
PAGEABLE_MIN_SHARE = 0.02  # ... or this share of the step spent in pageable copies
FP32_SHARE_MIN = 0.5  # fp32-compute-bound: plain-float32 GEMM/conv share of GPU busy time ...
FP32_BUSY_MIN = 0.5  # ... on a GPU busy at least this share of the step
PYTHON_SHARE_MIN = 0.5  # slow-python-loop: Python outside torch ops, share of the step
# host-sync-in-loop and pageable-h2d-copy warn only when the GPU idles at least this share of the
# step: a sync or a staged copy costs the GPU the time it waits for the host's next launches, so
# removing them all gains at most the idle time (llm.c's train_gpt2.py: 3 syncs a step, GPU busy
# 95% of it: at most 5%, info)
GPU_IDLE_MIN = 0.10

HOST_SYNC_IN_LOOP = declare("host-sync-in-loop", PERFORMANCE, "warning",
                            "device-to-host syncs every step stall the GPU",
                            thresholds={"GPU_IDLE_MIN": GPU_IDLE_MIN})
LAUNCH_BOUND = declare(
    "launch-bound", PERFORMANCE, "warning",
    f"GPU busy < {LAUNCH_BUSY_MAX:.0%} of step time while data wait is low: many small kernels",
    thresholds={"LAUNCH_BUSY_MAX": LAUNCH_BUSY_MAX, "DATA_SHARE": DATA_SHARE})
PAGEABLE_H2D_COPY = declare(
    "pageable-h2d-copy", PERFORMANCE, "warning",
    "host-to-device copies come from pageable memory",
    thresholds={"PAGEABLE_MIN_BYTES": PAGEABLE_MIN_BYTES, "PAGEABLE_MIN_SHARE": PAGEABLE_MIN_SHARE,
                "GPU_IDLE_MIN": GPU_IDLE_MIN})
FP32_COMPUTE_BOUND = declare(
    "fp32-compute-bound", MIXED_PRECISION, "warning",
    "matmul/conv dominate GPU time in float32 on a GPU with bf16 tensor cores",
    thresholds={"FP32_SHARE_MIN": FP32_SHARE_MIN, "FP32_BUSY_MIN": FP32_BUSY_MIN})
SLOW_PYTHON_LOOP = declare(
    "slow-python-loop", PERFORMANCE, "info",
    "Python-side CPU time dominates the step (no GPU)",
    thresholds={"PYTHON_SHARE_MIN": PYTHON_SHARE_MIN})


# --------------------------------------------------------------------------- shared evidence

def window(ev: Evidence) -> dict[str, Any]:
    """The profiler window's summary, or NotApplicable saying why there is none."""
    w = ev.last("profile_window")
    if w is None:
        raise NotApplicable("the profiler window did not run")
    status = w.get("status")
    if status == "not-reached":
        raise NotApplicable(not_reached(w))
    if status in ("unavailable", "failed", "empty"):
        raise NotApplicable(f"profiler {status}: {w.get('reason') or w.get('error')}")
    if not w.get("active_steps"):
        if w.get("open_step_dropped"):
            raise NotApplicable(
                "the profiler window recorded no complete step: the run ended inside it, and what "
                "followed the last step (checkpoint save, process-group teardown, exit) is not "
                "per-step work")
        raise NotApplicable("the profiler window recorded no complete step")
    return w


def bare_clock(ev: Evidence, w: dict[str, Any]) -> dict[str, Any]:
    """:func:`torchdoctor.evidence.profile.bare_clock`, or NotApplicable without a step time."""
    clock = measured_clock(ev, w)
    if clock is None:
        raise NotApplicable("no step time was measured")
    return clock


def gpu_window(ev: Evidence) -> tuple[dict[str, Any], dict[str, Any]]:
    """(window, device payload) for GPU rules; NotApplicable without CUDA work in the window."""
    w = window(ev)
    if not w.get("cuda"):
        raise NotApplicable("needs CUDA")
    dev = ev.last("profile_device")
    if not dev or not dev.get("device_events"):
        raise NotApplicable("no GPU work in the profiled steps")
    return w, dev


def idle_bound(dev: dict[str, Any], step_ms: float) -> tuple[str | None, dict[str, Any]]:
    """(severity, evidence) for a cost paid in GPU idle time: "info" with what it can cost at
    most when the GPU is busy more than 1 - GPU_IDLE_MIN of the step, else None (the
    declared severity)."""
    busy = float(dev.get("gpu_busy_ms") or 0.0)
    if step_ms <= 0 or busy <= 0:
        return None, {}
    share = min(1.0, busy / step_ms)
    ev = {"gpu_busy_share": round(share, 4)}
    if 1.0 - share >= GPU_IDLE_MIN:
        return None, ev
    ev["costs_at_most"] = (f"{_pct(1.0 - share)} of the step: the GPU is busy {_pct(share)} of it, "
                           f"so removing this gains no more than its idle time")
    return "info", ev


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 1024:.0f} KiB"


def _site_line(s: dict[str, Any], extra: str = "") -> str:
    out = s.get("site", "unknown")
    if s.get("code"):
        out += f"  {s['code']}"
    if extra:
        out += f"  ({extra})"
    return out


# --------------------------------------------------------------------------- the rules

@rule("profiler-window", probes=PROBES, needs={"profile_window"}, raises=["internal-error"])
def profiler_window_failed(ev: Evidence) -> list[Finding]:
    """A window that broke is torchdoctor's failure: say so instead of a quiet skip."""
    w = ev.last("profile_window")
    if not w or w.get("status") != "failed":
        return []
    return [internal_finding(f"the profiler window failed: {w.get('error')}",
                             {"traceback": w.get("traceback", "")})]


@rule("host-sync-in-loop", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_syncs", "step"},
      raises=[HOST_SYNC_IN_LOOP])
def host_sync_in_loop(ev: Evidence) -> list[Finding]:
    w, dev = gpu_window(ev)
    sy = ev.last("profile_syncs")
    if sy is None:
        raise NotApplicable("no CUDA runtime calls were recorded")
    per_step = sy.get("per_step") or []
    if not per_step or min(per_step) < 1:
        return []
    sites = sy.get("sites") or []
    n = sum(per_step) / len(per_step)
    top = sites[0] if sites else {"site": "unknown"}
    title = (f"the host waits for the GPU {n:g}x per step"
             + (f" at {top['site']}" if top.get("site") else "")
             + (f" ({top['code']})" if top.get("code") else ""))
    clock = bare_clock(ev, w)
    evidence = {
        "syncs_per_step": n,
        "sync_wait_ms_per_step": sy.get("wait_ms"),
        "step_ms": clock["step_ms"],
        "call_sites": [_site_line(s, f"{s.get('per_step')}/step via {', '.join(s.get('ops') or s.get('calls') or [])}")
                       for s in sites[:5]],
        "profiled_steps": w.get("steps"),
    }
    if sy.get("excluded"):
        evidence["not_counted"] = sy["excluded"]
    severity, bound = idle_bound(dev, clock["step_ms"])
    evidence.update(bound)
    return [finding(
        "host-sync-in-loop", title, evidence, severity=severity,
        fix="Keep per-step values on the GPU: accumulate `loss.detach()` and call `.item()` / "
            "`.cpu()` / `print()` only every N steps or after the epoch; avoid "
            "`torch.cuda.synchronize()` and data-dependent shapes (`nonzero`, boolean indexing) "
            "inside the loop; `torch.cuda.set_sync_debug_mode('warn')` points at every "
            "remaining sync.")]


@rule("launch-bound", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_ops", "step"}, raises=[LAUNCH_BOUND])
def launch_bound(ev: Evidence) -> list[Finding]:
    w, dev = gpu_window(ev)
    clock = bare_clock(ev, w)
    if not dev.get("kernels_per_step"):
        raise NotApplicable("no CUDA kernels in the profiled steps")
    step_ms = clock["step_ms"]
    busy_ms = float(dev.get("gpu_busy_ms") or 0.0)
    share = min(1.0, busy_ms / step_ms) if step_ms > 0 else 1.0
    if share >= LAUNCH_BUSY_MAX or clock["data_share"] >= DATA_SHARE:
        return []
    title = (f"the GPU is busy only {_pct(share)} of the step: {dev['kernels_per_step']:g} kernels "
             f"per step, median {dev.get('median_kernel_us', 0):g} µs each")
    evidence = {
        "gpu_busy_share": round(share, 4),
        "gpu_busy_ms_per_step": busy_ms,
        "step_ms": step_ms,
        "kernels_per_step": dev.get("kernels_per_step"),
        "median_kernel_us": dev.get("median_kernel_us"),
        "data_wait_share": clock["data_share"],
        "step_time_from": f"{clock['steps']} un-profiled steps" if clock["source"] == "bare"
        else "the profiled steps",
    }
    ops = (ev.last("profile_ops") or {}).get("by_self_cpu") or []
    if ops:
        evidence["top_host_ops"] = [f"{o['name']} {o['self_cpu_ms']:g} ms, {o['calls']:g} calls"
                                    for o in ops[:3]]
    return [finding(
        "launch-bound", title, evidence,
        fix="Give the GPU bigger pieces of work: raise the batch size (scale the LR), fuse the "
            "small ops with `torch.compile(model)` (mode=\"reduce-overhead\" adds CUDA graphs), "
            "use fused/foreach optimizers, and remove per-step host syncs so the CPU can queue "
            "work ahead.")]


@rule("pageable-h2d-copy", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_copies", "step", "dataloader"},
      raises=[PAGEABLE_H2D_COPY])
def pageable_h2d_copy(ev: Evidence) -> list[Finding]:
    w, dev = gpu_window(ev)
    cp = ev.last("profile_copies")
    if cp is None:
        raise NotApplicable("no copies were recorded")
    per_step = cp.get("pageable_h2d_per_step") or []
    if not per_step or min(per_step) < 1:
        return []
    bytes_step = cp.get("pageable_h2d_bytes_per_step") or [0]
    mean_bytes = sum(bytes_step) / len(bytes_step)
    clock = bare_clock(ev, w)
    copy_ms = float(cp.get("pageable_h2d_ms") or 0.0)
    share = copy_ms / clock["step_ms"] if clock["step_ms"] > 0 else 0.0
    if mean_bytes < PAGEABLE_MIN_BYTES and share < PAGEABLE_MIN_SHARE:
        return []
    sites = cp.get("pageable_sites") or []
    top = sites[0] if sites else {}
    title = (f"{_mib(mean_bytes)} per step copied host→device from pageable memory"
             + (f" at {top['site']}" if top.get("site") else ""))
    evidence = {
        "copies_per_step": sum(per_step) / len(per_step),
        "bytes_per_step": int(mean_bytes),
        "copy_ms_per_step": copy_ms,
        "step_ms": clock["step_ms"],
        "call_sites": [_site_line(s, f"{_mib(s.get('bytes_per_step', 0))}/step") for s in sites[:5]],
    }
    loaders = ev.of("dataloader")
    if loaders:
        evidence["dataloader_pin_memory"] = [bool(d.get("pin_memory")) for d in loaders]
    severity, bound = idle_bound(dev, clock["step_ms"])
    evidence.update(bound)
    return [finding(
        "pageable-h2d-copy", title, evidence, severity=severity,
        fix="Copy from pinned memory without blocking: `DataLoader(..., pin_memory=True)` and "
            "`x.to(device, non_blocking=True)`; for tensors built by hand, allocate a pinned "
            "buffer once (`torch.empty(..., pin_memory=True)`) and copy into it; create "
            "constant tensors directly on the GPU (`torch.tensor(..., device='cuda')`) outside "
            "the loop.")]


@rule("fp32-compute-bound", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_gemm", "device", "step"},
      raises=[FP32_COMPUTE_BOUND])
def fp32_compute_bound(ev: Evidence) -> list[Finding]:
    w, dev = gpu_window(ev)
    info = w.get("device") or {}
    cap = info.get("capability") or (ev.last("device") or {}).get("capability")
    if not cap:
        raise NotApplicable("the GPU's compute capability is unknown")
    if tuple(cap) < (8, 0):
        raise NotApplicable(f"needs a GPU with bf16 tensor cores (compute capability {cap[0]}.{cap[1]} < 8.0)")
    g = ev.last("profile_gemm")
    if g is None:
        raise NotApplicable("no kernels were recorded")
    busy_ms = float(dev.get("gpu_busy_ms") or 0.0)
    clock = bare_clock(ev, w)
    busy_share = min(1.0, busy_ms / clock["step_ms"]) if clock["step_ms"] > 0 else 0.0
    fp32_ms = float(g.get("fp32_plain_ms") or 0.0)
    share = fp32_ms / busy_ms if busy_ms > 0 else 0.0
    if share < FP32_SHARE_MIN or busy_share < FP32_BUSY_MIN:
        return []
    title = (f"float32 matmul/conv kernels take {_pct(share)} of GPU time with neither TF32 nor "
             f"autocast, on a GPU with bf16 tensor cores")
    flags = w.get("flags") or {}
    evidence = {
        "fp32_gemm_share_of_gpu_time": round(share, 4),
        "fp32_gemm_ms_per_step": fp32_ms,
        "gpu_busy_ms_per_step": busy_ms,
        "gpu_busy_share": round(busy_share, 4),
        "gemm_time_by_dtype_ms": g.get("mm_conv_by_dtype_ms"),
        "ops": [_site_line(o, f"{o['op']}, {o['device_ms']:g} ms/step") for o in (g.get("fp32_ops") or [])[:4]],
        "kernels": [k["name"] for k in (g.get("fp32_kernels") or [])[:3]],
        "gpu": info.get("name"),
        "tf32": {k: flags[k] for k in ("matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision")
                 if k in flags},
    }
    return [finding(
        "fp32-compute-bound", title, evidence,
        fix="Run forward and loss under `torch.autocast('cuda', dtype=torch.bfloat16)` (bf16 needs "
            "no GradScaler); or at least let float32 GEMMs use TF32: "
            "`torch.set_float32_matmul_precision('high')` (and `torch.backends.cudnn.allow_tf32 = "
            "True` for convolutions). Check the loss curve once after switching.")]


@rule("slow-python-loop", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_host", "profile_python", "step"},
      raises=[SLOW_PYTHON_LOOP])
def slow_python_loop(ev: Evidence) -> list[Finding]:
    """Python share = (un-profiled step − data wait − torch op time) / un-profiled step.

    Both terms are the *least-disturbed* step (minimum): on a shared CPU, preemption by a
    neighbour adds wall time to whichever code runs, and medians of a few steps then swing
    either way; the minimum of each is the best estimate of the work. Op time comes from the
    profiled steps, where profiling adds a little to each op: the share errs low, not high.
    """
    w = window(ev)
    if w.get("cuda") and (ev.last("profile_device") or {}).get("device_events"):
        raise NotApplicable("GPU run: host-side time is judged by launch-bound")
    host = ev.last("profile_host")
    if not host:
        raise NotApplicable("no host-side profile")
    clock = bare_clock(ev, w)
    step_ms = clock["min_step_ms"]
    ops_ms = float(host.get("ops_ms_min", host.get("ops_ms")) or 0.0)
    py_ms = max(0.0, clock["min_step_no_data_ms"] - ops_ms)
    share = py_ms / step_ms if step_ms > 0 else 0.0
    if share < PYTHON_SHARE_MIN:
        return []
    hot = [f for f in (ev.last("profile_python") or {}).get("functions", []) if f.get("self_ms", 0) > 0]
    title = (f"Python outside torch ops takes {_pct(share)} of the step ({py_ms:.3g} of {step_ms:.3g} ms)"
             + (f"; hottest: {hot[0]['func']} at {hot[0]['def']}" if hot else ""))
    evidence = {
        "python_share": round(share, 4),
        "step_ms": step_ms,
        "torch_ops_ms": ops_ms,
        "median_step_ms": clock["step_ms"],
        "data_wait_ms": clock["data_ms"],
        "python_hotspots": [f"{f['def']} {f['func']}: {f['self_ms']:g} ms/step self"
                            + (" (in the DataLoader)" if f.get("in_data") else "") for f in hot[:5]],
    }
    return [finding(
        "slow-python-loop", title, evidence,
        fix="Vectorise the per-element Python work (tensor or numpy ops instead of loops over "
            "values); move input preparation into a Dataset served by DataLoader workers "
            "(num_workers > 0) so it overlaps with training; cache what does not change between "
            "steps; for model code, torch.compile removes most of the Python overhead.")]
