"""Console section: memory timeline (sparklines) and the breakdown bar (``metrics['memory']``)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.memory.units import human_bytes
from torchdoctor.report.sections import section

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 30
BAR = 40
COLORS = {"parameters": "blue", "gradients": "magenta", "optimizer_state": "cyan",
          "activations": "yellow", "other": "white", "cached_free": "bright_black"}


def sparkline(values: list[float | int | None], width: int = SPARK_WIDTH) -> str:
    """Unicode sparkline of ``values`` (None skipped), scaled between their min and max."""
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    if len(vals) > width:
        vals = [vals[round(i * (len(vals) - 1) / (width - 1))] for i in range(width)]
    lo, hi = min(vals), max(vals)
    if hi == lo:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))]
                   for v in vals)


def _timeline(m: dict[str, Any]) -> Table | None:
    tl = m.get("timeline")
    if not tl or not tl.get("step"):
        return None
    steps = tl["step"]
    t = Table(title=f"Memory at step ends: steps {steps[0]}-{steps[-1]}", title_justify="left",
              title_style="bold", show_edge=False, pad_edge=False)
    t.add_column("series")
    t.add_column("timeline")
    t.add_column("first", justify="right")
    t.add_column("change", justify="right")
    t.add_column("trend/step", justify="right")
    trend = m.get("trend") or {}
    rows: list[tuple[str, list, str | None]] = []
    for key in sorted(k for k in tl if k.startswith("cuda:")):
        rows.append((f"{key} allocated", tl[key]["allocated"], key))
        rows.append((f"{key} reserved", tl[key]["reserved"], None))
    if any(v is not None for v in tl.get("heap", [])):
        rows.append(("host heap in use", tl["heap"], "heap"))
    elif any(v is not None for v in tl.get("rss", [])):
        rows.append(("host RSS", tl["rss"], "rss"))
    if any(v for v in tl.get("activations_at_backward") or []):
        rows.append(("activations (bwd start)", tl["activations_at_backward"], None))
    for label, vals, tkey in rows:
        present = [v for v in vals if v is not None]
        if not present:
            continue
        tr = trend.get(tkey, {}) if tkey else {}
        slope = tr.get("bytes_per_step")
        t.add_row(label, Text(sparkline(vals), style="green", no_wrap=True, overflow="crop"),
                  human_bytes(present[0]), human_bytes(present[-1] - present[0], signed=True),
                  human_bytes(slope, signed=True) if slope is not None else "")
    return t


def _breakdown(m: dict[str, Any]) -> Table | None:
    b = m.get("breakdown")
    if not b or not b.get("parts"):
        return None
    parts = b["parts"]
    total = sum(v for v in parts.values() if v) or 1
    t = Table(title=f"Memory at the {b.get('at', 'peak')} of step {b.get('step')} "
                    f"({b.get('device')}): {human_bytes(b.get('total'))}",
              title_justify="left", title_style="bold", show_edge=False, pad_edge=False,
              min_width=64)
    t.add_column("part")
    t.add_column("bytes", justify="right")
    t.add_column("share", justify="right")
    t.add_column("")
    for k, v in parts.items():
        share = (v or 0) / total
        n = max(0, min(BAR, round(share * BAR)))
        t.add_row(k.replace("_", " "), human_bytes(v), f"{share:.0%}",
                  Text("█" * n, style=COLORS.get(k, "white")))
    notes = []
    if b.get("gradients_full") is not None:
        notes.append(f"gradients after backward: {human_bytes(b['gradients_full'])}")
    if b.get("peak"):
        notes.append(f"allocator peak so far: {human_bytes(b['peak'])}")
    if b.get("heap_above_baseline") is not None:
        notes.append(f"C heap above its pre-script level: {human_bytes(b['heap_above_baseline'])}")
    if notes:
        t.caption = "; ".join(notes)
        t.caption_justify = "left"
    return t


@section("memory", order=30)
def memory_section(report) -> Group | None:
    m = report.metrics.get("memory")
    if not m:
        return None
    items = [x for x in (_timeline(m), _breakdown(m)) if x is not None]
    if not items:
        return None
    out: list[Any] = []
    for i, x in enumerate(items):
        if i:
            out.append(Text(""))
        out.append(x)
    return Group(*out)
