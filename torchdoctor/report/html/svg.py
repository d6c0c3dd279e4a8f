"""Static SVG charts, drawn at report time: a line chart and a horizontal bar chart.

Why not a plotting library: the report must open offline as one file, and the two chart kinds
it needs (per-step curves, ranked bars) are a few dozen lines of SVG. matplotlib (≈ 40 MB,
not a torchdoctor dependency) would add an import of seconds for the same output; a
JavaScript library would have to be inlined (hundreds of KB) or fetched (a network request).
Every label passes through :func:`esc` (controls made visible, then HTML-escaped): labels come
from scripts and checkpoints.

Sizes are in SVG user units with a ``viewBox``, so a chart scales to the page width (a phone
too). Series are thinned to at most ``MAX_POINTS`` points (every k-th point, the last kept) so
a 100 000-step run stays small.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

from torchdoctor.safe import visible

W, H = 640, 220
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 18, 34
MAX_POINTS = 600
COLORS = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")


def esc(value: object) -> str:
    """Untrusted text for HTML text or attribute: controls visible, then escaped."""
    return html.escape(visible(value), quote=True)


def esc_lines(value: object) -> str:
    """As :func:`esc`, keeping newlines and tabs (multi-line evidence, tracebacks)."""
    return html.escape(visible(value, keep_newlines=True), quote=True)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-2:
        return f"{v:.2g}"
    return f"{v:.3g}"


def _thin(xs: Sequence[float], ys: Sequence[float]) -> list[tuple[float, float]]:
    pts = [(float(x), float(y)) for x, y in zip(xs, ys)
           if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y)]
    if len(pts) <= MAX_POINTS:
        return pts
    k = math.ceil(len(pts) / MAX_POINTS)
    return pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])


def line_chart(series: Sequence[tuple[str, Sequence[float], Sequence[float]]], *, title: str,
               x_label: str = "step", y_label: str = "", log_y: bool = False,
               marks: Sequence[tuple[float, str]] = (), from_zero: bool = True) -> str:
    """Curves sharing one x axis; ``marks``: vertical lines at x with a label (a NaN step);
    ``from_zero=False``: the y axis spans the data only (a slow growth stays visible)."""
    drawn = [(name, _thin(xs, ys)) for name, xs, ys in series]
    drawn = [(n, [(x, y) for x, y in p if not log_y or y > 0]) for n, p in drawn]
    drawn = [(n, p) for n, p in drawn if p]
    if not drawn:
        return ""
    xs = [x for _, p in drawn for x, _ in p] + [m for m, _ in marks]
    ys = [y for _, p in drawn for _, y in p]
    tf = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(tf(y) for y in ys), max(tf(y) for y in ys)
    if not log_y and from_zero:
        y0 = min(y0, 0.0) if y0 >= 0 and y0 < 0.5 * y1 else y0
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + (abs(y0) or 1.0) * 0.1
        y0 = y0 - (abs(y0) or 1.0) * 0.1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def px(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return PAD_T + ph - (tf(y) - y0) / (y1 - y0) * ph

    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}" class="chart">',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" class="plot"/>']
    for i in range(5):  # y grid and labels
        fy = y0 + (y1 - y0) * i / 4
        yy = PAD_T + ph - ph * i / 4
        lab = _fmt(10 ** fy) if log_y else _fmt(fy)
        out.append(f'<line x1="{PAD_L}" x2="{PAD_L + pw}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>'
                   f'<text x="{PAD_L - 6}" y="{yy + 4:.1f}" class="tick" text-anchor="end">{lab}</text>')
    for i in range(5):  # x labels
        fx = x0 + (x1 - x0) * i / 4
        fx = round(fx) if x1 - x0 >= 8 else round(fx, 2)  # steps are whole numbers
        out.append(f'<text x="{px(fx):.1f}" y="{H - PAD_B + 16}" class="tick" '
                   f'text-anchor="middle">{_fmt(fx)}</text>')
    out.append(f'<text x="{PAD_L + pw / 2}" y="{H - 4}" class="axis" text-anchor="middle">'
               f'{esc(x_label)}</text>')
    if y_label:
        out.append(f'<text x="12" y="{PAD_T + ph / 2}" class="axis" text-anchor="middle" '
                   f'transform="rotate(-90 12 {PAD_T + ph / 2})">{esc(y_label)}'
                   f'{" (log)" if log_y else ""}</text>')
    for x, label in marks:  # the label on the side of the line with room for it
        left = px(x) > PAD_L + pw / 2
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{PAD_T}" y2="{PAD_T + ph}" '
                   f'class="mark"/><text x="{px(x) + (-4 if left else 4):.1f}" y="{PAD_T + 12}" '
                   f'class="marklabel" text-anchor="{"end" if left else "start"}">{esc(label)}</text>')
    for i, (name, pts) in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        if len(pts) == 1:
            x, y = pts[0]
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
    legend = "".join(f'<span class="key"><i style="background:{COLORS[i % len(COLORS)]}"></i>'
                     f'{esc(name)}</span>' for i, (name, _p) in enumerate(drawn))
    out.append("</svg>")
    return (f'<figure><figcaption>{esc(title)}</figcaption>{"".join(out)}'
            f'<div class="legend">{legend}</div></figure>')


def bar_chart(rows: Sequence[tuple[str, float, float | None]], *, title: str, unit: str = "",
              reference: float | None = None) -> str:
    """Horizontal bars (label, value, ± band or None); ``reference``: a vertical line (1.0×)."""
    rows = [(lab, float(v), b) for lab, v, b in rows if isinstance(v, (int, float)) and math.isfinite(v)]
    if not rows:
        return ""
    bar_h, gap, left = 18, 8, 190
    h = PAD_T + len(rows) * (bar_h + gap) + 24
    top = max([v + (b or 0) for _l, v, b in rows] + [reference or 0]) or 1.0
    pw = W - left - 70

    def px(v: float) -> float:
        return left + max(0.0, v) / top * pw

    out = [f'<svg viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}" class="chart">']
    for i, (label, v, band) in enumerate(rows):
        y = PAD_T + i * (bar_h + gap)
        out.append(f'<text x="{left - 6}" y="{y + 13}" class="tick" text-anchor="end">'
                   f'{esc(label[:32])}</text>'
                   f'<rect x="{left}" y="{y}" width="{px(v) - left:.1f}" height="{bar_h}" '
                   f'fill="{COLORS[0]}"/>'
                   f'<text x="{px(v) + 4:.1f}" y="{y + 13}" class="tick">{_fmt(v)}{esc(unit)}</text>')
        if band:
            out.append(f'<line x1="{px(v - band):.1f}" x2="{px(v + band):.1f}" y1="{y + bar_h / 2}" '
                       f'y2="{y + bar_h / 2}" class="band"/>')
    if reference is not None:
        x = px(reference)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T - 6}" y2="{h - 20}" class="mark"/>'
                   f'<text x="{x:.1f}" y="{h - 6}" class="tick" text-anchor="middle">'
                   f'{_fmt(reference)}{esc(unit)}</text>')
    out.append("</svg>")
    return f'<figure><figcaption>{esc(title)}</figcaption>{"".join(out)}</figure>'


def share_bar(parts: Sequence[tuple[str, float]], *, title: str) -> str:
    """One 100 % bar split into labelled shares (the step's phases)."""
    parts = [(n, float(s)) for n, s in parts if isinstance(s, (int, float)) and s > 0]
    total = sum(s for _n, s in parts)
    if total <= 0:
        return ""
    out, x = [f'<svg viewBox="0 0 {W} 46" role="img" aria-label="{esc(title)}" class="chart">'], 0.0
    for i, (name, s) in enumerate(parts):
        w = s / total * W
        out.append(f'<rect x="{x:.1f}" y="4" width="{w:.1f}" height="22" '
                   f'fill="{COLORS[i % len(COLORS)]}"/>')
        if w > 8 * (len(name) + 5):
            out.append(f'<text x="{x + 4:.1f}" y="19" class="inbar">{esc(name)} {s / total:.0%}</text>')
        x += w
    out.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{COLORS[i % len(COLORS)]}"></i>'
                     f'{esc(n)} {s / total:.1%}</span>' for i, (n, s) in enumerate(parts))
    return f'<figure><figcaption>{esc(title)}</figcaption>{"".join(out)}<div class="legend">{legend}</div></figure>'
