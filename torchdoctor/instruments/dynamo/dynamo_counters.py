"""Dynamo counters at the end of the run: was the model compiled, and how did it go.

The cheap view of ``torch.compile`` that every ``checkup`` arms (need ``dynamo_counters``):
nothing during the run; at the end, when dynamo was imported, its counters (frames it
tried and compiled, graphs, graph breaks) and its compile records (recompiles, the recompile
limit, compile seconds). The detail — which line, which guard, which step — is the
``dynamo_diag`` instrument's (``torchdoctor compile``).

Event ``dynamo_counters`` {loaded, frames, frames_ok, graphs, graph_breaks, recompiles,
limit_hit, compile_s, records, disabled}. Cost: one read at the end.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor import torch_internals as ti
from torchdoctor.instruments.base import Instrument, register

LIMIT_TEXT = "recompile limit"  # dynamo's failure title when the limit is hit (torch >= 2.6)


@register
class DynamoCounters(Instrument):
    name = "dynamo_counters"
    produces = frozenset({"dynamo_counters"})
    priority = 90

    def uninstall(self, ctx: Any) -> None:
        ctx.emit("dynamo_counters", **read_counters())


def read_counters() -> dict[str, Any]:
    out: dict[str, Any] = {"loaded": ti.dynamo_loaded(),
                           "disabled": os.environ.get("TORCHDYNAMO_DISABLE") == "1"
                           or os.environ.get("TORCH_COMPILE_DISABLE") == "1"}
    c = ti.dynamo_counters()
    if c is None:
        return out
    frames = c.get("frames") or {}
    stats = c.get("stats") or {}
    out.update(frames=int(frames.get("total", 0)), frames_ok=int(frames.get("ok", 0)),
               graphs=int(stats.get("unique_graphs", 0)),
               graph_breaks=int(sum((c.get("graph_break") or {}).values())))
    recs = ti.dynamo_compilation_records() or []
    out["records"] = len(recs)
    out["recompiles"] = sum(1 for r in recs if getattr(r, "recompile_reason", None))
    out["limit_hit"] = any(LIMIT_TEXT in str(getattr(r, "fail_reason", "") or "").lower()
                           for r in recs) or any(
        LIMIT_TEXT in str(k).lower() for k in (c.get("unimplemented") or {}))
    secs = 0.0
    for r in recs:
        s = getattr(r, "entire_frame_compile_time_s", None)
        if s is None and getattr(r, "backward_cumulative_compile_time_us", None) is not None:
            s = r.backward_cumulative_compile_time_us / 1e6
        secs += float(s or 0.0)
    out["compile_s"] = round(secs, 3)
    lim = ti.dynamo_recompile_limit()
    if lim:
        out["limit_name"], out["limit"] = lim
    return out
