"""The ``memory`` metrics of a report: timeline, trend fits, breakdown, sites, OOM summary.

Pure (Evidence in, JSON-able dict out). Timelines are thinned to TIMELINE_POINTS samples.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.memory.growth import judge
from torchdoctor.evidence.memory import cuda_end_stats, memory_series, room_left, step_seconds, thin
from torchdoctor.memory.trend import fit_trend
from torchdoctor.pipeline.registry import metrics_provider

TIMELINE_POINTS = 120


def _timeline(ev: Evidence) -> dict[str, Any]:
    mems = thin(ev.of("mem"), TIMELINE_POINTS)
    tl: dict[str, Any] = {"step": [int(m["step"]) for m in mems],
                          "heap": [m.get("heap") for m in mems],
                          "rss": [m.get("rss") for m in mems]}
    devs = sorted({d for m in mems for d in (m.get("cuda") or {})})
    for d in devs:
        rows = [(m.get("cuda") or {}).get(d) for m in mems]
        tl[f"cuda:{d}"] = {"allocated": [r[0] if r else None for r in rows],
                           "reserved": [r[1] if r else None for r in rows],
                           "peak_allocated": [r[2] if r else None for r in rows]}
    if any("saved" in m for m in mems):
        tl["activations_at_backward"] = [(m.get("bwd") or {}).get("act") for m in mems]
        tl["saved_at_step_end"] = [m.get("saved") for m in mems]
    return tl


@metrics_provider("memory", needs={"mem", "mem_info", "mem_device", "mem_end", "mem_breakdown",
                                     "mem_sites", "mem_oom", "grad_eval", "step"})
def memory_metrics(ev: Evidence) -> dict[str, Any] | None:
    info = ev.last("mem_info")
    if info is None and not ev.has("mem"):
        return None
    out: dict[str, Any] = {"heap_counter": (info or {}).get("heap_counter"),
                           "baseline_heap": (info or {}).get("baseline_heap")}
    if ev.has("mem"):
        out["timeline"] = _timeline(ev)
    trends = {}
    step_s = step_seconds(ev)
    for s in memory_series(ev):
        f = fit_trend(s.steps, s.values)
        trends[s.key] = {"label": s.label, **(f.to_dict() if f else {"points": len(s.steps)})}
        if f is not None:  # the growth judgment's verdict (the rule adds the site window's view)
            v = judge(f, s.noisy, room_left(ev, s), step_s)
            trends[s.key]["growth"] = ({"severity": v.severity, "steps_until_full": v.steps_until_full}
                                       if v.credible else {"not_growth": v.why_not})
    if trends:
        out["trend"] = trends
    devices = ev.of("mem_device")
    if devices:
        out["devices"] = [{k: d.get(k) for k in ("index", "name", "capacity")} for d in devices]
    end = cuda_end_stats(ev)
    if end:
        out["cuda_end"] = end
    b = ev.last("mem_breakdown")
    if b:
        out["breakdown"] = {k: b.get(k) for k in ("step", "at", "device", "total", "parts",
                                                   "activations_fp32", "gradients_full", "peak",
                                                   "peak_reserved", "n_blocks",
                                                   "heap_above_baseline") if k in b}
    w = ev.last("mem_sites")
    if w:
        out["sites"] = {k: v for k, v in w.items() if k not in ("kind", "t", "pid")}
    o = ev.last("mem_oom")
    if o:
        out["oom"] = {k: v for k, v in o.items() if k not in ("kind", "t", "pid")}
    g = ev.last("grad_eval")
    if g:
        out["grad_eval"] = {k: g.get(k) for k in ("graph_forwards", "backpropagated", "dropped",
                                                  "kept_alive")}
    return out
