"""`ask SYMPTOM --run SCRIPT`: the route that chose this probe, drawn before the findings."""

from __future__ import annotations

from rich.text import Text

from torchdoctor.report.sections import section


@section("route", order=0)
def route_section(report):
    route = report.metrics.get("route")
    if not route:
        return None
    t = Text()
    t.append("Route: ", style="bold")
    t.append(route.get("skill", "?"), style="bold magenta")
    if route.get("then"):
        t.append("  then " + " → ".join(route["then"]), style="magenta")
    t.append(f"\n  asked: {route.get('query', '')}", style="dim")
    if route.get("why"):
        t.append(f"\n  why: {route['why']}", style="dim")
    t.append(f"\n  measuring now: {route.get('probe', '')}", style="dim")
    return t
