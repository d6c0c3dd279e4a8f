"""``report.metrics["gradcheck"]``: what the custom-Function check captured, checked and skipped.

One row per Function (calls seen, calls that built a graph, calls sampled) and one per sampled
call (status, reason when not checked, seconds, the sub-problem), plus the check's own cost and
budget. A Function whose calls could not be checked (a forward that fails in float64, a budget
spent) is listed here with the reason: "not checked" is not "correct".
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import metrics_provider
from torchdoctor.runner.frames import short_path


@metrics_provider("gradcheck", needs={"gradcheck_summary", "gradcheck_call", "autograd_function"})
def gradcheck_metrics(ev: Evidence) -> dict[str, Any] | None:
    summary = ev.last("gradcheck_summary")
    if summary is None:
        return None
    calls: dict[str, list[dict[str, Any]]] = {}
    for c in ev.of("gradcheck_call"):
        row = {"call": c.get("call"), "shapes": c.get("shapes"), "status": c.get("status"),
               "seconds": c.get("seconds")}
        if c.get("reason"):
            row["reason"] = c["reason"]
        if c.get("reduced"):
            row["checked_rows"] = c["reduced"].get("dim0")
        if c.get("status") == "checked":
            row["inputs"] = {str(i.get("arg")): _verdict(i) for i in c.get("inputs", [])}
            gg = c.get("gradgradcheck")
            if gg:
                row["gradgradcheck"] = ("passed" if gg.get("passed") else "failed" if gg.get("passed") is False
                                        else gg.get("why") or gg.get("error"))
        calls.setdefault(str(c.get("function")), []).append(row)
    functions = []
    for f in ev.of("autograd_function"):
        name = str(f.get("function"))
        functions.append({"function": name, "defined_at": short_path(f.get("forward_at")),
                          "calls": f.get("calls"), "graph_calls": f.get("graph_calls"),
                          "sampled": f.get("sampled"), "not_sampled": f.get("skipped") or {},
                          "checks": calls.get(name, [])})
    out = {"functions": functions, "sampled": summary.get("sampled"), "checked": summary.get("checked"),
           "seconds": summary.get("seconds"), "budget_s": summary.get("budget_s"),
           "capture": summary.get("capture")}
    if summary.get("error"):
        out["error"] = summary["error"]  # the check loop itself could not run
    return out


def _verdict(i: dict[str, Any]) -> str:
    """A short measured description of one input's comparison (not a judgment)."""
    parts = [f"{i.get('compared')}/{i.get('elements')} compared"]
    for key in ("confirmed", "kinks", "imprecise"):
        if i.get(key):
            parts.append(f"{i[key]} {key}")
    gc = i.get("gradcheck")
    if gc:
        parts.append("gradcheck " + ("passed" if gc.get("passed") else "failed" if gc.get("passed") is False
                                     else "error"))
    return ", ".join(parts)
