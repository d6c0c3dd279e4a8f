"""Console section of ``torchdoctor gradcheck``: which custom Functions were checked, and how.

Drawn from ``report.metrics["gradcheck"]`` (``pipeline/gradcheck_metrics.py``): one row per
Function (where it is defined, calls seen, calls checked / sampled, what the checks saw), then the
check's cost. A Function that could not be checked says why: "not checked" is not "correct".
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section


def _outcome(checks: list[dict]) -> str:
    if not checks:
        return "no call that builds a graph was sampled"
    statuses = [c.get("status") for c in checks]
    if all(s == "checked" for s in statuses):
        return "checked"
    reasons = sorted({str(c.get("reason") or c.get("status")) for c in checks if c.get("status") != "checked"})
    return "; ".join(r[:120] for r in reasons[:2])


@section("gradcheck", order=30)
def gradcheck_section(report) -> Group | None:
    m = report.metrics.get("gradcheck")
    if not m:
        return None
    fns = m.get("functions") or []
    head = Text("Custom autograd Functions: ", style="bold")
    if not fns:
        head.append("none was called")
        return Group(head)
    head.append(f"{len(fns)} seen, {m.get('checked')} of {m.get('sampled')} sampled calls checked "
                f"in float64 in {m.get('seconds')} s (budget {m.get('budget_s')} s)")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("function", "defined at", "calls", "checked", "outcome"):
        table.add_column(col)
    for f in fns:
        checks = f.get("checks") or []
        done = sum(1 for c in checks if c.get("status") == "checked")
        table.add_row(Text(visible(str(f.get("function")))), Text(visible(str(f.get("defined_at") or "?"))),
                      str(f.get("calls")), f"{done}/{len(checks)}", Text(visible(_outcome(checks))))
    return Group(head, table)
