"""Console section: the yardstick, one line — achieved FLOP/s per step and MFU (or why not).

Drawn from ``report.metrics['flops']`` (``pipeline/flops_metrics.py``). Every string here is
torchdoctor's own or a GPU name read from the driver; rendered as ``Text``, never markup.
"""

from __future__ import annotations

from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section

_UNITS = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float) -> str:
    """4.2e12 -> '4.2 T' (FLOP counts and rates)."""
    for f, u in _UNITS:
        if abs(x) >= f:
            return f"{x / f:.3g} {u}"
    return f"{x:.3g} "


def flops_line(m: dict) -> Text:
    t = Text("FLOPs: ", style="bold")
    if m.get("status") != "ok":
        t.append(f"not measured ({m.get('status')}): {visible(str(m.get('reason') or ''))}", style="yellow")
        return t
    t.append(f"{si(float(m['flops_per_step']))}FLOP per step (step {m.get('counted_step')}, "
             f"{m.get('dtype')}) in a {m['step_ms']:.3g} ms median step = "
             f"{si(float(m['achieved_flops_per_s']))}FLOP/s")
    if m.get("mfu") is not None:
        suspect = m.get("mfu_suspect")
        t.append(f"; MFU {m['mfu']:.1%}" + (" (suspect)" if suspect else ""),
                 style="bold yellow" if suspect else "bold cyan")
        pd = f" {m['peak_dtype']}" if m.get("peak_dtype") else ""
        t.append(f" of {si(float(m['peak_flops_per_s']))}FLOP/s{pd} peak "
                 f"({visible(str(m.get('device_name') or ''))})", style="dim")
        if m.get("mfu_dtype_peak") is not None and m.get("dtype_peak_flops_per_s") \
                and abs(float(m["dtype_peak_flops_per_s"]) - float(m["peak_flops_per_s"])) > 1:
            t.append(f"; {m['mfu_dtype_peak']:.1%} of the {m.get('dtype')} peak "
                     f"{si(float(m['dtype_peak_flops_per_s']))}FLOP/s", style="dim")
        if suspect:
            t.append(f"; {visible(str(suspect))}", style="yellow")
    elif m.get("mfu_reason"):
        t.append(f"; no MFU: {visible(str(m['mfu_reason']))}", style="dim")
    return t


@section("flops", order=31)
def flops_section(report):
    m = report.metrics.get("flops")
    if not m:
        return None
    return flops_line(m)
