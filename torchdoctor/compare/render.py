"""Showing a comparison: terminal (rich), JSON (the comparison dict), HTML (tables + before/after
plots of the per-step series and memory timelines). Every string from a report is data:
``visible()`` on the terminal, ``esc()`` in HTML."""

from __future__ import annotations

from typing import Any

ARROWS = {"better": "✓", "worse": "✗", None: "·"}
STYLES = {"better": "green", "worse": "bold red", None: "dim"}


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "bytes":
        v, units = abs(float(value)), ("B", "KiB", "MiB", "GiB", "TiB")
        i = 0
        while v >= 1024 and i < len(units) - 1:
            v, i = v / 1024, i + 1
        return f"{'-' if value < 0 else ''}{v:.3g} {units[i]}"
    if unit == "ratio":
        return f"{100 * float(value):.3g}%"
    if unit == "FLOP/s":
        return f"{float(value):.3g}"
    return f"{float(value):.3g} {unit}"


def _signed(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    return ("+" if value >= 0 else "-") + fmt(abs(value), unit)


def rows(cmp: dict) -> list[list[str]]:
    """metric, before, after, delta (rel), ± band, verdict: the table both renderers draw."""
    out = []
    for d in cmp["deltas"]:
        rel = f" ({100 * d['rel']:+.1f}%)" if d.get("rel") is not None else ""
        band = f"± {fmt(d['band'], d['unit'])}" if d.get("band") is not None else "—"
        out.append([d["label"], fmt(d["before"], d["unit"]), fmt(d["after"], d["unit"]),
                    _signed(d["delta"], d["unit"]) + rel, band, d["verdict"]])
    return out


def render_console(cmp: dict, console) -> None:
    from rich.table import Table
    from rich.text import Text

    from torchdoctor.safe import visible

    b, a = cmp["before"], cmp["after"]
    head = Text()
    head.append("torchdoctor compare", style="bold")
    for tag, side in (("before", b), ("after", a)):
        head.append(f"\n{tag:6} ", style="dim")
        head.append(visible(side.get("path") or ""), style="bold")
        head.append(f"  {visible(side.get('command') or '')} {visible(side.get('target') or '')}"
                    f"  ({visible(side.get('status'))}, {side.get('steps_judged') or 0} steps judged)", style="dim")
    console.print(head)
    table = Table(show_edge=False, box=None, pad_edge=False, header_style="bold")
    for col, just in (("metric", "left"), ("before", "right"), ("after", "right"), ("Δ", "right"),
                      ("noise band", "right"), ("verdict", "left")):
        table.add_column(col, justify=just)
    for d, r in zip(cmp["deltas"], rows(cmp)):
        style = STYLES[d.get("direction")]
        table.add_row(*[Text(c) for c in r[:-1]], Text(f"{ARROWS[d.get('direction')]} {r[-1]}", style=style))
    console.print()
    console.print(table)
    f = cmp["findings"]
    for word, items, style in (("appeared", f["appeared"], "bold red"), ("resolved", f["resolved"], "green")):
        for it in items:
            line = Text(f"{'+' if word == 'appeared' else '-'} {word} ", style=style)
            line.append(f"{visible(it['code'])} ({visible(it['severity'])})", style="bold")
            line.append(f"  {visible(it['title'])}" + ("  [host load, not the change]" if it.get("host_load") else ""))
            console.print(line)
    for c in f["changed"]:
        console.print(Text(f"~ {visible(c['code'])}: {visible(c['before'])} → {visible(c['after'])}"))
    for word, items in (("appeared", cmp["growing_sites"]["appeared"]), ("resolved", cmp["growing_sites"]["resolved"])):
        for s in items:
            console.print(Text(f"{'+' if word == 'appeared' else '-'} growing memory site {word}: {visible(s)}"))
    for n in cmp["notes"]:
        console.print(Text(f"note: {visible(n)}", style="yellow"))
    style = {"regression": "bold red", "improvement": "bold green"}.get(cmp["verdict"], "bold")
    foot = Text(f"\nverdict: {cmp['verdict']}", style=style)
    if cmp["regressions"]:
        foot.append(" — " + "; ".join(visible(r) for r in cmp["regressions"]))
    elif cmp["improvements"]:
        foot.append(" — " + "; ".join(visible(r) for r in cmp["improvements"]))
    console.print(foot)


def _plots(before: dict, after: dict) -> str:
    from torchdoctor.report.html.svg import line_chart

    out = []
    for key, title in (("wall_ms", "step time per step (ms)"), ("data_ms", "data wait per step (ms)")):
        series = []
        for tag, rep in (("before", before), ("after", after)):
            s = ((rep.get("metrics") or {}).get("steps") or {}).get("series") or {}
            if isinstance(s.get("step"), list) and isinstance(s.get(key), list):
                pts = [(x, y) for x, y in zip(s["step"], s[key]) if isinstance(x, (int, float))
                       and isinstance(y, (int, float)) and not isinstance(y, bool)]
                if pts:
                    series.append((tag, [p[0] for p in pts], [p[1] for p in pts]))
        if series:
            out.append(line_chart(series, title=title, y_label="ms"))
    for key, title in (("rss", "host RSS (bytes)"), ("heap", "host heap (bytes)")):
        series = []
        for tag, rep in (("before", before), ("after", after)):
            tl = ((rep.get("metrics") or {}).get("memory") or {}).get("timeline") or {}
            if isinstance(tl.get("step"), list) and isinstance(tl.get(key), list):
                pts = [(x, y) for x, y in zip(tl["step"], tl[key]) if isinstance(x, (int, float))
                       and isinstance(y, (int, float)) and not isinstance(y, bool)]
                if pts:
                    series.append((tag, [p[0] for p in pts], [p[1] for p in pts]))
        if series:
            out.append(line_chart(series, title=title, y_label="bytes", from_zero=False))
    return "".join(out)


def render_html(cmp: dict, before: dict, after: dict) -> str:
    from torchdoctor.report.html.page import document
    from torchdoctor.report.html.svg import esc

    head = "".join(f"<tr><th>{esc(k)}</th><td>{esc(s.get('path') or '')}</td><td>{esc(s.get('command') or '')} "
                   f"{esc(s.get('target') or '')}</td><td>{esc(s.get('status') or '')}</td></tr>"
                   for k, s in (("before", cmp["before"]), ("after", cmp["after"])))
    body = [f"<h1>torchdoctor compare: {esc(cmp['verdict'])}</h1><table>{head}</table>"]
    if cmp["regressions"] or cmp["improvements"]:
        body.append("<ul>" + "".join(f"<li><b>regression</b> {esc(r)}</li>" for r in cmp["regressions"])
                    + "".join(f"<li>improvement {esc(r)}</li>" for r in cmp["improvements"]) + "</ul>")
    body.append("<h2>Deltas</h2><table><tr><th>metric</th><th>before</th><th>after</th><th>Δ</th>"
                "<th>noise band</th><th>verdict</th></tr>"
                + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows(cmp))
                + "</table>")
    f = cmp["findings"]
    items = ([("appeared", it) for it in f["appeared"]] + [("resolved", it) for it in f["resolved"]])
    if items or f["changed"]:
        body.append("<h2>Findings</h2><table>" + "".join(
            f"<tr><td>{esc(w)}</td><td>{esc(it['code'])}</td><td>{esc(it['severity'])}</td>"
            f"<td>{esc(it['title'])}</td></tr>" for w, it in items) + "".join(
            f"<tr><td>changed</td><td>{esc(c['code'])}</td><td>{esc(c['before'])} → {esc(c['after'])}</td>"
            f"<td>{esc(c['title'])}</td></tr>" for c in f["changed"]) + "</table>")
    sites = cmp["growing_sites"]
    if sites["appeared"] or sites["resolved"]:
        body.append("<h2>Growing memory sites</h2><ul>" + "".join(
            f"<li>{w}: {esc(s)}</li>" for w in ("appeared", "resolved") for s in sites[w]) + "</ul>")
    plots = _plots(before, after)
    if plots:
        body.append("<h2>Before and after</h2>" + plots)
    if cmp["notes"]:
        body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in cmp["notes"]) + "</ul>")
    return document({"command": "compare", "target": f"{cmp['before'].get('path')} → {cmp['after'].get('path')}"},
                    "".join(body))
