"""Console section of the numerics monitor: loss and gradient-norm trend, first non-finite step.

Drawn from ``report.metrics["nan"]`` (``pipeline/nan_metrics.py``): one header line, then a
row per series with first / min / median / max / last and a sparkline (log scale for the
gradient norm, whose interesting changes are orders of magnitude).
"""

from __future__ import annotations

import math
import statistics

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 40


def _floats(vals: list) -> list[float | None]:
    out: list[float | None] = []
    for v in vals:
        try:
            out.append(float(v) if v is not None else None)
        except (TypeError, ValueError):
            out.append(None)
    return out


def _spark(vals: list[float | None], log: bool) -> Text:
    """A sparkline of ``vals``; non-finite points are a red ✗."""
    if len(vals) > WIDTH:
        stride = math.ceil(len(vals) / WIDTH)
        vals = [vals[i] for i in range(0, len(vals), stride)]
    fin = [v for v in vals if v is not None and math.isfinite(v) and (v > 0 or not log)]
    t = Text()
    if not fin:
        return t
    tr = (lambda x: math.log10(x)) if log else (lambda x: x)
    lo, hi = tr(min(fin)), tr(max(fin))
    span = (hi - lo) or 1.0
    for v in vals:
        if v is None:
            t.append(" ")
        elif not math.isfinite(v):
            t.append("✗", style="bold red")
        elif log and v <= 0:
            t.append(BARS[0], style="dim")
        else:
            t.append(BARS[min(len(BARS) - 1, int((tr(v) - lo) / span * (len(BARS) - 1) + 0.5))],
                     style="cyan")
    return t


def _g(v: float | None) -> str:
    if v is None:
        return ""
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return f"{v:.3g}"


def _row(tbl: Table, name: str, vals: list[float | None], log: bool) -> None:
    fin = [v for v in vals if v is not None and math.isfinite(v)]
    present = [v for v in vals if v is not None]
    if not present:
        return
    tbl.add_row(name, _g(present[0]), _g(min(fin)) if fin else "", _g(statistics.median(fin)) if fin else "",
                _g(max(fin)) if fin else "", _g(present[-1]), _spark(vals, log))


@section("nan", order=40)
def numerics(report):
    m = report.metrics.get("nan")
    if not m or not m.get("series"):
        return None
    head = Text()
    head.append("Numerics: ", style="bold")
    head.append(f"{m.get('checked_steps', 0)} steps checked")
    watch = "forward watch on" if m.get("forward_watch") else "loss and gradients only"
    every = m.get("check_every")
    when = "every step" if every == 1 else f"every {every} steps"
    head.append(f"  ·  {watch}" + (f", flags read {when}" if every else ""), style="dim")
    first = m.get("first_nonfinite")
    if first:
        head.append("  ·  first non-finite: ", style="bold")
        head.append(visible(f"step {first.get('step')}, {first.get('what')}"
                            + (f", {first['where']}" if first.get("where") else "")), style="bold red")
    replay = next((r for r in report.metrics.get("followups") or []
                   if r.get("by") == "replay_forward_watch"), None)
    if replay:  # checkup's replay with the forward watch (pipeline/followups_nan.py)
        secs = float(replay.get("seconds") or 0)
        head.append(f"  ·  replayed to that step with the forward watch ({secs:.1f} s): see the "
                    f"finding", style="dim")
    series = m["series"]
    clip = m.get("clipping")
    if clip:
        head.append(f"\nclip_grad_norm_ active (max_norm {clip.get('max_norm')}): it clipped "
                    f"{clip.get('clipped_steps')} of {clip.get('steps')} checked steps; the grad norm "
                    f"shown is the one before clipping", style="dim")
    opts = sorted({p[1] for p in series if p[1] is not None})
    tbl = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for col, just in (("series", "left"), ("first", "right"), ("min", "right"), ("median", "right"),
                      ("max", "right"), ("last", "right"), ("trend", "left")):
        tbl.add_column(col, justify=just)
    _row(tbl, "loss", _floats([p[2] for p in series]), log=False)
    for o in opts or [None]:
        name = "grad norm" + (f" (optimizer {o})" if len(opts) > 1 else "")
        mine = [p for p in series if p[1] == o or o is None]
        if clip:  # before clipping where a clip was seen in that step, else the norm the optimizer got
            _row(tbl, name + " pre-clip", _floats([p[4] if len(p) > 5 and p[5] is not None else p[3]
                                                       for p in mine]), log=True)
        else:
            _row(tbl, name, _floats([p[3] for p in mine]), log=True)
    return Group(head, tbl)
