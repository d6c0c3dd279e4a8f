"""Console section of ``repro``: the verdict and the two runs' losses side by side.

Drawn from ``report.metrics["repro"]`` (``reprocheck/flow.py``): one line (identical over N
steps, or the first divergent step and what diverged first; the first differing op when the
localising pair found one; the deterministic pair's result), then a table of the losses of run A
and run B for the first ``FIRST_ROWS`` steps and the divergent step, a ``≠`` where they differ.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section

FIRST_ROWS = 8


def _g(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.9g}"
    return visible(v)


def loss_rows(losses_a: list, losses_b: list, divergent: int | None) -> list[tuple[int, str, str, bool]]:
    """(step, loss A, loss B, differ) for the first FIRST_ROWS steps, then the divergent step."""
    n = max(len(losses_a), len(losses_b))
    steps = list(range(1, min(n, FIRST_ROWS) + 1))
    if divergent and divergent not in steps and divergent <= n:
        steps.append(divergent)
    rows = []
    for s in steps:
        a = losses_a[s - 1] if s - 1 < len(losses_a) else None
        b = losses_b[s - 1] if s - 1 < len(losses_b) else None
        rows.append((s, _g(a), _g(b), a != b))
    return rows


def verdict(rep: dict) -> Text:
    t = Text()
    if not rep.get("compared"):
        t.append("Runs not compared: ", style="bold")
        t.append(visible(rep.get("reason") or "?"))
        return t
    if rep.get("identical"):
        t.append("Two runs identical", style="bold green")
        t.append(f" over {rep.get('steps_compared')} steps (bitwise: batches, forward outputs, "
                 f"losses, gradients, parameters)")
        return t
    t.append(f"Runs diverge at step {rep.get('first_divergent_step')}", style="bold yellow")
    t.append(": " + visible((rep.get("diverged") or {}).get("description") or "?"))
    op = rep.get("first_divergent_op") or {}
    if op.get("op"):
        t.append("\nFirst differing op: ", style="bold")
        t.append(visible(op["op"]))
        if op.get("module"):
            t.append(f" in {visible(op['module'])}")
        if op.get("where"):
            t.append(f" at {visible(op['where'])}")
        t.append(f" ({visible(op.get('kind'))}"
                 + (", same inputs" if op.get("inputs_equal") else "") + ")")
    elif op.get("reason"):
        t.append("\nOp trace: " + visible(op["reason"]))
    det = rep.get("deterministic") or {}
    if det:
        t.append("\nDeterministic mode: ", style="bold")
        if det.get("reproducible"):
            t.append(f"identical runs, step time ×{det.get('cost')} "
                     f"({det.get('median_step_ms')} vs {det.get('baseline_median_step_ms')} ms)")
        elif det.get("reproducible") is False:
            t.append(f"runs still differ (step {det.get('first_divergent_step')})")
        else:
            t.append(visible(det.get("failure") or "not measured"))
    return t


@section("repro", order=24)
def repro(report):
    rep = report.metrics.get("repro")
    if not rep:
        return None
    parts = [verdict(rep)]
    losses = rep.get("losses") or {}
    rows = loss_rows(losses.get("a") or [], losses.get("b") or [], rep.get("first_divergent_step"))
    if rows:
        table = Table(title=None, box=None, pad_edge=False, show_edge=False)
        table.add_column("step", justify="right")
        table.add_column("loss, run A", justify="right")
        table.add_column("loss, run B", justify="right")
        table.add_column("")
        for s, a, b, differ in rows:
            table.add_row(str(s), a, b, Text("≠", style="bold red") if differ else Text(""))
        parts.append(table)
    return Group(*parts)
