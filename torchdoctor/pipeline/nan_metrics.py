"""``report.metrics["nan"]``: the loss and gradient-norm series and what the monitor did.

Series are thinned to at most ``MAX_POINTS`` points (the first non-finite step always kept).
Non-finite values are the strings "nan" / "inf" / "-inf" (JSON has no NaN).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import metrics_provider

MAX_POINTS = 200


def _thin(points: list[list], keep: int | None) -> list[list]:
    if len(points) <= MAX_POINTS:
        return points
    stride = -(-len(points) // MAX_POINTS)
    out = [p for i, p in enumerate(points) if i % stride == 0 or p[0] == keep or i == len(points) - 1]
    return out


def clipping(points: list[list]) -> dict[str, Any]:
    """How often ``clip_grad_norm_`` bit: steps whose norm before clipping exceeded ``max_norm``."""
    seen = [(p[4], p[5]) for p in points if p[5] is not None and isinstance(p[4], (int, float))]
    bit = sum(1 for pn, cm in seen if pn > cm)
    maxes = sorted({cm for _pn, cm in seen})
    return {"max_norm": maxes[0] if len(maxes) == 1 else maxes, "steps": len(seen), "clipped_steps": bit,
            "steps_without_clip": sum(1 for p in points if p[5] is None)}


@metrics_provider("nan", needs={"nan_monitor", "numerics", "nonfinite", "nan_capture"})
def nan_metrics(ev: Evidence) -> dict[str, Any] | None:
    mon = ev.last("nan_monitor")
    rows = ev.of("numerics")
    if mon is None and not rows:
        return None
    nf = ev.last("nonfinite")
    first = nf.get("step") if nf else None
    points: list[list] = []
    clipped = any(e.get("clip_max") for e in rows)
    for e in rows:
        n = len(e.get("steps", []))
        pre, cmax = e.get("grad_norm_pre_clip") or [None] * n, e.get("clip_max") or [None] * n
        for step, opt, loss, gn, pn, cm in zip(e.get("steps", []), e.get("opt", []), e.get("loss", []),
                                               e.get("grad_norm", []), pre, cmax):
            points.append([step, opt, loss, gn] + ([pn, cm] if clipped else []))
    out: dict[str, Any] = {
        "forward_watch": bool((mon or {}).get("forward_watch")),
        "check_every": (mon or {}).get("check_every"),
        "checked_steps": len(points),
        "series_columns": ["step", "optimizer", "loss", "grad_norm"]
        + (["grad_norm_pre_clip", "clip_max"] if clipped else []),
        "series": _thin(points, first),
    }
    if clipped:
        out["clipping"] = clipping(points)
    if mon and mon.get("rows"):
        out["records_per_step"] = round(mon.get("records", 0) / max(1, mon["rows"]), 1)
    if nf:
        out["first_nonfinite"] = {"step": first, "what": nf.get("what"),
                                  "where": nf.get("module") or nf.get("param")}
    cap = ev.last("nan_capture")
    if cap:
        out["rerun"] = {"reproduced": cap.get("reproduced"),
                        "op": (cap.get("op") or {}).get("op")}
    return out
