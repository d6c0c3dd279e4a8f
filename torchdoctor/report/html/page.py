"""The HTML page: one self-contained file (inline CSS, inline SVG, no script, no fetch).

A Content-Security-Policy in the page itself (``default-src 'none'``; inline styles and
``data:`` images only) makes the browser refuse any request the page might try, so "opens
offline, no network request" holds by construction, not only by care. Findings come first
(severity, title, evidence table, fix, docs), then the plots that fit the report's metrics
(:mod:`.sections`), then every other metric as escaped text in a collapsed block.

Every string from the report passes through :func:`torchdoctor.report.html.svg.esc`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from torchdoctor.report.caps import bounded
from torchdoctor.report.html.svg import esc, esc_lines

MARKER = "<!-- torchdoctor report -->"  # first line: how we recognise a file we may overwrite
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")
SEVERITY = {"error": ("✖", "sev-error"), "warning": ("▲", "sev-warning"), "info": ("●", "sev-info")}

CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#fff;--err:#b91c1c;--warn:#b45309;--info:#0369a1}
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;
color:var(--fg);background:var(--bg);margin:0 auto;max-width:980px;padding:16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 6px}.muted{color:var(--muted)}code,pre{font:13px/1.4 ui-monospace,Menlo,monospace}
pre{white-space:pre-wrap;word-break:break-word;background:#f9fafb;padding:8px;border:1px solid var(--line)}
.finding{border:1px solid var(--line);border-left:5px solid var(--line);padding:8px 12px;margin:10px 0}
.sev-error{border-left-color:var(--err)}.sev-warning{border-left-color:var(--warn)}.sev-info{border-left-color:var(--info)}
.badge{font-weight:600}.sev-error .badge{color:var(--err)}.sev-warning .badge{color:var(--warn)}.sev-info .badge{color:var(--info)}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px;display:block;overflow-x:auto}
td,th{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.ev{white-space:pre-wrap;word-break:break-word;font:13px/1.35 ui-monospace,Menlo,monospace}
.finding table{margin:6px 0 2px}.finding th{width:22%;min-width:110px}
.fix{margin-top:6px}.fix b{color:var(--fg)}figure{margin:10px 0}figcaption{font-weight:600;font-size:14px}
svg.chart{width:100%;height:auto;display:block}.plot{fill:#fafafa;stroke:var(--line)}
.grid{stroke:var(--line)}.tick{font-size:11px;fill:var(--muted)}.axis{font-size:12px;fill:var(--muted)}
.mark{stroke:#b91c1c;stroke-dasharray:4 3}.marklabel{font-size:11px;fill:#b91c1c}.band{stroke:#111827;stroke-width:2}
.inbar{font-size:12px;fill:#fff}.legend{font-size:12px;color:var(--muted)}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.ok{color:#047857;font-weight:600}details{margin:8px 0}summary{cursor:pointer;color:var(--muted)}
"""


def fmt_value(v: Any) -> str:
    """A compact text form of an evidence value (escaped by the caller), within the caps of
    :mod:`torchdoctor.report.caps` (the console's)."""
    return _fmt(bounded(v))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "\n".join(_fmt(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def header(rep: dict[str, Any]) -> str:
    ctx = rep.get("context") or {}
    facts = [f"{k} {ctx[k]}" for k in ("device", "torch", "python") if ctx.get(k)]
    run = (rep.get("metrics") or {}).get("run") or {}
    ended = run.get("reason") or run.get("outcome")
    if ended:
        facts.append(f"run: {ended}")
    facts.append("report written " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    return (f'<h1>torchdoctor {esc(rep.get("command", ""))} <span class="muted">'
            f'{esc(rep.get("target") or "")}</span></h1>'
            f'<div class="muted">{" · ".join(esc(f) for f in facts)}</div>'
            f'<div class="muted">torchdoctor {esc(rep.get("version", ""))} · status '
            f'{esc(rep.get("status", ""))}</div>')


def finding_html(f: dict[str, Any]) -> str:
    sev = str(f.get("severity", ""))
    mark, cls = SEVERITY.get(sev, ("?", ""))
    rows = "".join(f'<tr><th>{esc(k)}</th><td class="ev">{esc_lines(fmt_value(v))}</td></tr>'
                   for k, v in (f.get("evidence") or {}).items() if not str(k).startswith("_"))
    fix = f'<div class="fix"><b>Fix:</b> {esc_lines(f["fix"])}</div>' if f.get("fix") else ""
    docs = (f'<div class="muted">{esc(f["docs"])} · <code>torchdoctor explain {esc(f.get("code", ""))}'
            f"</code></div>") if f.get("docs") else ""
    return (f'<section class="finding {cls}"><div><span class="badge">{mark} {esc(sev)} '
            f'{esc(f.get("code", ""))}</span> {esc(f.get("title", ""))}</div>'
            f'{"<table>" + rows + "</table>" if rows else ""}{fix}{docs}</section>')


def findings_html(rep: dict[str, Any]) -> str:
    fs = rep.get("findings") or []
    if not fs:
        return '<h2>Findings</h2><p class="ok">✓ No problems found</p>'
    n = {s: sum(1 for f in fs if f.get("severity") == s) for s in ("error", "warning", "info")}
    summary = f'{len(fs)} finding{"s" if len(fs) != 1 else ""} ({n["error"]} errors, {n["warning"]} warnings)'
    return f"<h2>Findings</h2><p>{esc(summary)}</p>" + "".join(finding_html(f) for f in fs)


def skipped_html(rep: dict[str, Any]) -> str:
    sk = rep.get("skipped") or []
    if not sk:
        return ""
    rows = "".join(f"<tr><td>{esc(s.get('rule', ''))}</td><td>{esc(s.get('reason', ''))}</td></tr>"
                   for s in sk if isinstance(s, dict))
    return (f"<details><summary>{len(sk)} checks not applicable</summary><table><tr><th>check</th>"
            f"<th>why</th></tr>{rows}</table></details>")


def raw_metrics_html(rep: dict[str, Any], shown: set[str]) -> str:
    rest = {k: v for k, v in (rep.get("metrics") or {}).items() if k not in shown}
    if not rest:
        return ""
    text = json.dumps(rest, indent=1, default=str)
    if len(text) > 200_000:
        text = text[:200_000] + "\n… (cut: the whole report is in report.json / --json)"
    return f"<details><summary>Other measurements (JSON)</summary><pre>{esc(text)}</pre></details>"


def document(rep: dict[str, Any], body: str) -> str:
    title = f"torchdoctor {rep.get('command', '')} {rep.get('target') or ''}".strip()
    return (f"{MARKER}\n<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n")
