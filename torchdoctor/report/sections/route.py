"""`ask SYMPTOM --run SCRIPT`: the route that chose this probe, drawn before the findings.

The query and the why quote the user's words or lines of a pasted log: untrusted, so escaped.
"""

from __future__ import annotations

from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section


@section("route", order=0)
def route_section(report):
    route = report.metrics.get("route")
    if not route:
        return None
    t = Text()
    t.append("Route: ", style="bold")
    t.append(visible(route.get("skill", "?")), style="bold magenta")
    if route.get("then"):
        then = [r.get("skill", "?") if isinstance(r, dict) else r for r in route["then"]]
        t.append("  then " + " → ".join(visible(s) for s in then), style="magenta")
    t.append(f"\n  asked: {visible(route.get('query', ''))}", style="dim")
    if route.get("why"):
        t.append(f"\n  why: {visible(route['why'])}", style="dim")
    t.append(f"\n  measuring now: {visible(route.get('probe', ''))}", style="dim")
    if route.get("after"):
        t.append("\n  then: ", style="bold")
        t.append(visible(route["after"]), style="bold cyan")
        t.append("  (applies each fix that fits in the child and measures it against this run)", style="dim")
    return t
