"""A shareable report: one self-contained HTML file (``--html``, and always under ``--out``).

    from torchdoctor.report.html import render_html
    text = render_html(report_dict)   # the same dict as --json prints

It renders from the JSON form of the report, so a saved ``report.json`` renders the same way.
Layout: header (command, script, device, torch, how the run ended), findings first, then the
plots and tables that fit the metrics (:mod:`.sections`), then the remaining metrics as text.
Inline CSS and SVG only: no script, no external resource, and a Content-Security-Policy that
forbids any request (:mod:`.page`). Every string from the report is escaped.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.report.html.page import (MARKER, document, findings_html, header,  # noqa: F401
                                          raw_metrics_html, skipped_html)
from torchdoctor.report.html.sections import SECTIONS


def render_html(rep: dict[str, Any]) -> str:
    metrics = rep.get("metrics") or {}
    parts = [header(rep), findings_html(rep)]
    shown: set[str] = set()
    for key, fn in SECTIONS:
        try:
            block = fn(metrics)
        except Exception as e:  # noqa: BLE001 - a broken section must not lose the report
            block = (f"<p class=\"muted\">(the {key} section could not be drawn: "
                     f"{type(e).__name__})</p>")
        if block:
            parts.append(block)
            shown.add(key)
    parts.append(skipped_html(rep))
    parts.append(raw_metrics_html(rep, shown))
    return document(rep, "".join(parts))
