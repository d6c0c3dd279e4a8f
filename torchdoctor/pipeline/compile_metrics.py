"""Metrics of torch.compile (``report.metrics['compile']``): the JSON ``compile`` section.

Pure (:func:`torchdoctor.compilecheck.summary.summarize`). Present for a ``compile`` run, and
for any other run in which dynamo compiled something (``checkup`` arms ``dynamo_counters``);
absent otherwise, so a run without torch.compile gains no section. The ``compile`` command
adds the eager comparison (``eager_step_ms``, ``speedup``) after its eager trial.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import metrics_provider


@metrics_provider("compile", needs={"dynamo_counters", "dynamo_compile", "dynamo_step",
                                    "dynamo_break", "dynamo_recompile", "dynamo_limit", "step"})
def compile_metrics(ev: Evidence) -> dict[str, Any] | None:
    from torchdoctor.compilecheck.summary import summarize

    out = summarize(ev)
    if out is None:
        return None
    if not out["compiled"] and ev.meta.get("probe") != "compile":
        return None
    return out
