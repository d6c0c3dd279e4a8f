"""Metrics of the profiler window (``report.metrics['profile']``), for the console and JSON.

Pure: Evidence in, a compact dict out (None when the run had no profiler window). Times are
milliseconds per step; GPU shares are judged against the un-profiled step time, as the rules do.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import metrics_provider


@metrics_provider("profile", needs={
    "profile_window", "profile_ops", "profile_host", "profile_python", "profile_device",
    "profile_kernels", "profile_gemm", "profile_copies", "profile_syncs", "step"})
def profile_metrics(ev: Evidence) -> dict[str, Any] | None:
    w = ev.last("profile_window")
    if w is None:
        return None
    out: dict[str, Any] = {"status": w.get("status")}
    for k in ("steps", "wait", "warmup", "active", "trace", "trace_bytes", "trace_dropped", "analysis_s",
              "reason", "error", "steps_seen", "steps_needed", "stopped_early"):
        if w.get(k) is not None:
            out[k] = w[k]
    if (w.get("budget") or {}).get("reason"):
        out["budget"] = w["budget"]["reason"]
    if (w.get("device") or {}).get("name"):
        out["gpu"] = w["device"]["name"]
    if w.get("status") == "not-reached":
        from torchdoctor.evidence.profile import not_reached

        out["reason"] = not_reached(w)
    if w.get("status") not in ("ok", "partial"):
        return out
    from torchdoctor.evidence.profile import bare_clock

    clock = bare_clock(ev, w)
    if clock is not None:
        out["step_ms"] = clock["step_ms"]
    recorded = [float(s["wall_s"]) * 1e3 for s in ev.of("step") if s.get("step") in set(w.get("steps") or [])]
    if recorded and clock and clock["source"] == "bare" and clock["step_ms"] > 0:
        med = sorted(recorded)[len(recorded) // 2]
        out["window_cost"] = {"recorded_step_ms": round(med, 4), "step_ms": clock["step_ms"],
                              "ratio": round(med / clock["step_ms"], 3), "analysis_s": w.get("analysis_s")}
    dev = ev.last("profile_device")
    if dev and dev.get("device_events"):
        out["gpu_busy_ms"] = dev.get("gpu_busy_ms")
        out["kernels_per_step"] = dev.get("kernels_per_step")
        out["median_kernel_us"] = dev.get("median_kernel_us")
        if clock and clock["step_ms"] > 0:
            out["gpu_busy_share"] = round(min(1.0, float(dev.get("gpu_busy_ms") or 0) / clock["step_ms"]), 4)
    host = ev.last("profile_host")
    if host:
        out["host"] = {k: host.get(k) for k in ("profiled_step_ms", "ops_ms", "python_ms")}
    ops = ev.last("profile_ops") or {}
    gpu = bool(dev and dev.get("device_events"))
    out["top_ops"] = (ops.get("by_device") if gpu else None) or ops.get("by_self_cpu") or []
    out["top_ops_by"] = "device" if gpu and ops.get("by_device") else "self_cpu"
    kern = ev.last("profile_kernels")
    if kern:
        out["top_kernels"] = kern.get("rows", [])
    sy = ev.last("profile_syncs")
    if sy:
        out["syncs"] = {"per_step": sy.get("per_step"), "wait_ms": sy.get("wait_ms"),
                        "sites": sy.get("sites", [])[:5], "not_counted": sy.get("excluded")}
    cp = ev.last("profile_copies")
    if cp:
        out["copies"] = {"kinds": cp.get("kinds"), "pageable_sites": cp.get("pageable_sites", [])[:5]}
    g = ev.last("profile_gemm")
    if g:
        out["gemm"] = {k: g.get(k) for k in ("mm_conv_ms", "fp32_plain_ms", "mm_conv_by_dtype_ms")}
    py = ev.last("profile_python")
    if py and py.get("functions"):
        out["python_hotspots"] = py["functions"][:5]
    return out
