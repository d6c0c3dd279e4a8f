"""Console line under the step table: the run was cut by the ``--steps`` limit.

Drawn from ``report.metrics["run"]["stopped_by"] == "steps"`` (set by ``pipeline/run.py`` only
when the limit ended the run, not when the script ended on its own before it).
"""

from __future__ import annotations

from rich.text import Text

from torchdoctor.report.sections import section


def step_limit_note(run: dict) -> str | None:
    """The sentence, or None when the run was not cut by the step limit."""
    if not run or run.get("stopped_by") != "steps":
        return None
    n = run.get("step_limit")
    which = "the default --steps" if run.get("step_limit_default") else "the --steps limit"
    return (f"stopped after {n} steps ({which}), not at the end of the script; run longer with "
            f"--steps N (0: no limit)")


@section("step-limit", order=21)
def step_limit(report) -> Text | None:
    note = step_limit_note(report.metrics.get("run") or {})
    if note is None:
        return None
    head, _, rest = note.partition(" (")
    t = Text(head[0].upper() + head[1:], style="bold")
    t.append(" (" + rest)
    return t
