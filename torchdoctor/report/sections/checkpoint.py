"""Console section of `checkpoint-audit`: what the checkpoint holds, per top-level entry."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.report.sections import section


def _size(n: int | float | None) -> str:
    if not n:
        return "" if n is None else "0 B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _dtypes(d: dict) -> str:
    return ", ".join(list(d)[:3]) + (" …" if len(d) > 3 else "")


@section("checkpoint", order=20)
def checkpoint_contents(report):
    m = report.metrics.get("checkpoint")
    if not m or "entries" not in m:
        return None
    head = Text()
    head.append("Checkpoint ", style="bold")
    head.append(f"{m['format']}", style="bold magenta")
    head.append(f"  ·  {m['files']} file{'s' if m['files'] != 1 else ''}, {_size(m['file_bytes'])}"
                f"  ·  {m['tensors']} tensors, {_size(m['tensor_bytes'])}")
    head.append(f"  ·  judged as {m['judged_as']} checkpoint", style="dim")
    if m.get("expect") == "auto":
        head.append(" (auto)", style="dim")
    tbl = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for col, just in (("entry", "left"), ("role", "left"), ("type", "left"), ("tensors", "right"),
                      ("size", "right"), ("dtypes", "left"), ("devices", "left")):
        tbl.add_column(col, justify=just, overflow="fold")
    for e in m["entries"]:
        typ = e.get("type", "")
        if "value" in e:
            typ = f"{typ} = {e['value']}"
        devs = ", ".join(e.get("devices", {}) or {})
        tbl.add_row(str(e["key"]), e.get("role", ""), typ, str(e.get("tensors", "")) if e.get("tensors") else "",
                    _size(e.get("bytes")) if e.get("tensors") else "", _dtypes(e.get("dtypes", {})),
                    devs if devs != "cpu" else "cpu")
    lines = [head, tbl]
    foot = Text(style="dim")
    foot.append(f"torch.load(weights_only=True): {m.get('weights_only_load', '?')}")
    s = m.get("scan")
    if s:
        rate = s["bytes"] / s["seconds"] / 2**30 if s.get("seconds") else 0
        foot.append(f"  ·  NaN/Inf scan: {s['tensors']} tensors, {_size(s['bytes'])} in {s['seconds']:.2f} s"
                    + (f" ({rate:.1f} GiB/s)" if s["bytes"] > 64 << 20 else ""))
        if s.get("not_scanned"):
            foot.append(f", {len(s['not_scanned'])} not scanned")
    if m.get("unsafe_load"):
        foot.append("  ·  loaded with --unsafe-load (weights_only=False)", style="bold red")
    lines.append(foot)
    return Group(*lines)
