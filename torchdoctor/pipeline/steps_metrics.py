"""The ``steps`` and ``run`` metrics of a report, from the step summaries of
:mod:`torchdoctor.evidence.steps` (which the rules read too)."""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.evidence.steps import step_summary
from torchdoctor.pipeline.registry import metrics_provider


@metrics_provider("steps", needs={"step", "step_device"})
def steps_metrics(ev: Evidence) -> dict[str, Any] | None:
    return step_summary(ev)


@metrics_provider("run", needs={"step", "script_start"})
def run_metrics(ev: Evidence) -> dict[str, Any] | None:
    res = ev.result
    if not res:
        return None
    out = {k: res[k] for k in ("outcome", "exit_code", "reason", "signal", "timeout_s", "wall_s",
                               "steps", "interrupted", "interrupted_by", "killed_after_interrupt",
                               "clean_stop_requested", "processes_left")
           if res.get(k) is not None}
    first = ev.of("step")
    start = ev.last("script_start")
    if first and start:
        out["time_to_first_step_s"] = round(float(first[0]["t"]) - float(start["t"]), 3)
    return out
