"""Console section of `checkpoint-audit`: what the checkpoint holds, per top-level entry.

Every key, type name, value, dtype and device here comes from the file: each cell is a
:func:`~torchdoctor.safe.safe_text` (control bytes shown as ``\\x1b``, never parsed
as markup), so a crafted key can neither move the cursor nor break the table.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import safe_text, visible
from torchdoctor.report.sections import section


def _size(n) -> str:
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return ""
    if not n:
        return "0 B"
    if isinstance(n, int) and n.bit_length() > 80:
        return f"{n.bit_length()}-bit size"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _dtypes(d) -> str:
    d = d if isinstance(d, dict) else {}
    return ", ".join(str(k) for k in list(d)[:3]) + (" …" if len(d) > 3 else "")


def _cell(v, limit: int = 120) -> Text:
    s = visible(v)
    return safe_text(s if len(s) <= limit else s[:limit] + "…")


@section("checkpoint", order=20)
def checkpoint_contents(report):
    m = report.metrics.get("checkpoint")
    if not m or "entries" not in m:
        return None
    head = Text()
    head.append("Checkpoint ", style="bold")
    head.append(visible(m.get("format", "?")), style="bold magenta")
    files = m.get("files", 0)
    head.append(f"  ·  {files} file{'s' if files != 1 else ''}, {_size(m.get('file_bytes'))}"
                f"  ·  {m.get('tensors', 0)} tensors, {_size(m.get('tensor_bytes'))}")
    mode = m.get("judged_as", "?")
    head.append("  ·  judged as one part of a checkpoint" if mode == "part" else
                f"  ·  judged as {visible(mode)} checkpoint", style="dim")
    if m.get("expect") == "auto":
        head.append(" (auto)", style="dim")
    tbl = Table(show_header=True, header_style="bold", box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for col, just in (("entry", "left"), ("role", "left"), ("type", "left"), ("tensors", "right"),
                      ("size", "right"), ("dtypes", "left"), ("devices", "left")):
        tbl.add_column(col, justify=just, overflow="fold")
    for e in m["entries"]:
        typ = visible(e.get("type", ""))
        if "value" in e:
            typ = f"{typ} = {visible(e['value'])}"
        devs = ", ".join(str(d) for d in (e.get("devices") or {}))
        n = e.get("tensors")
        tbl.add_row(_cell(e.get("key", "")), _cell(e.get("role", "")), _cell(typ),
                    Text(str(n) if n else ""), Text(_size(e.get("bytes")) if n else ""),
                    _cell(_dtypes(e.get("dtypes", {}))), _cell(devs))
    lines = [head, tbl]
    foot = Text(style="dim")
    foot.append(f"torch.load(weights_only=True): {visible(m.get('weights_only_load', '?'))}")
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
