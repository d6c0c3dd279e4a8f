"""Console rendering of a Report with rich: header, sections, one block per finding, footer."""

from __future__ import annotations

import os
import traceback
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.text import Text

from torchdoctor.findings import MARKS, Finding, Report
from torchdoctor.report.caps import bounded
from torchdoctor.safe import safe_text, visible

STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}


def make_console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (str, int, float)) for x in v) and len(v) <= 8:
            return ", ".join(_fmt_value(x) for x in v)
        return "; ".join(_fmt_value(x) for x in v[:8]) + (f" … (+{len(v) - 8})" if len(v) > 8 else "")
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt_value(x)}" for k, x in list(v.items())[:8])
    return str(v)


def header(report: Report) -> Text:
    t = Text()
    t.append("torchdoctor ", style="bold")
    t.append(report.command, style="bold magenta")
    if report.target:
        t.append("  ")
        t.append(visible(report.target), style="bold")
    ctx = report.context
    bits = [f"{k} {visible(ctx[k])}" for k in ("device", "torch", "python") if ctx.get(k)]
    if bits:
        t.append("\n" + "  ·  ".join(bits), style="dim")
    return t


def finding_block(f: Finding) -> Group:
    title = Text()
    title.append(f"{MARKS.get(f.severity, '?')} ", style=STYLES.get(f.severity, ""))
    title.append(visible(f.code), style=STYLES.get(f.severity, ""))
    title.append(f"  {visible(f.title)}")
    lines: list[Any] = [title]
    for k, v in f.evidence.items():
        if k.startswith("_"):
            continue
        lines.append(Padding(safe_text(f"{k}: {_fmt_value(bounded(v))}", style="dim", keep_newlines=True),
                             (0, 0, 0, 4)))
    if f.fix:
        fix = Text("Fix:", style="bold")
        fix.append(" " + visible(f.fix, keep_newlines=True))
        lines.append(Padding(fix, (0, 0, 0, 4)))
    if f.docs:
        lines.append(Padding(safe_text(f"{f.docs}  (torchdoctor explain {f.code})", style="dim italic"),
                             (0, 0, 0, 4)))
    return Group(*lines)


def run_ended(report: Report) -> Text | None:
    """One line on how the run ended when it did not end on its own (interrupted, timeout)."""
    run = report.metrics.get("run") if isinstance(report.metrics.get("run"), dict) else {}
    steps = run.get("steps")
    after = f" after {steps} step{'' if steps == 1 else 's'}" if isinstance(steps, int) else ""
    timeout = run.get("timeout_s")
    limit = f" ({timeout:g} s)" if isinstance(timeout, (int, float)) else ""
    if report.run_status == "interrupted":
        by = run.get("interrupted_by") or "Ctrl-C"
        by = "Ctrl-C (SIGINT)" if by == "SIGINT" else by
        killed = ", killed after the grace period" if run.get("killed_after_interrupt") else ""
        return Text(f"Run interrupted by {by}{after}{killed}: the findings judge only what ran "
                    f"before it.", style="bold yellow")
    if report.run_status == "timeout":
        return Text(f"Run killed at the --timeout{limit}{after}: it was still running.",
                    style="bold red")
    if run.get("reason") == "--timeout reached":
        return Text(f"Run stopped cleanly at the --timeout{limit}{after}.", style="bold")
    return None


def footer(report: Report) -> Text:
    c = report.counts()
    n = len(report.findings)
    ended = run_ended(report)
    t = Text()
    if ended is not None:
        t.append_text(ended)
        t.append("\n")
    if n == 0:
        if report.run_status in ("interrupted", "timeout"):
            t.append("No problems found in what ran", style="bold")
        else:
            t.append("✓ No problems found", style="bold green")
        return t
    word = "finding" if n == 1 else "findings"
    style = "bold red" if c["error"] else ("bold yellow" if c["warning"] else "bold")
    t.append(f"{n} {word} ({c['error']} errors, {c['warning']} warnings)", style=style)
    return t


def render(report: Report, console: Console | None = None) -> None:
    """Print the report to ``console`` (stdout by default)."""
    from torchdoctor.report.sections import sections

    con = console or make_console()
    con.print(header(report))
    for _order, name, fn in sections():
        try:
            renderable = fn(report)
        except Exception:  # a broken section must not hide the findings
            renderable = safe_text(f"(section {name} failed: {traceback.format_exc(limit=1).strip()})",
                                   style="dim red", keep_newlines=True)
        if renderable is not None:
            con.print()
            con.print(renderable)
    for f in report.sorted_findings():
        con.print()
        con.print(finding_block(f))
    if report.skipped:
        con.print()
        con.print(safe_text("Not judged: " + "; ".join(f"{s.rule} ({s.reason})" for s in report.skipped),
                            style="dim"))
    if report.artifacts:
        con.print()
        for k, v in report.artifacts.items():
            con.print(safe_text(f"{k}: {v}", style="cyan"))
    con.print()
    con.print(footer(report))


def render_to_text(report: Report, width: int = 100) -> str:
    """The console rendering as plain text (tests, `--out` report.txt)."""
    con = Console(width=width, record=True, file=open(os.devnull, "w"),
                  color_system=None, highlight=False)
    render(report, con)
    return con.export_text()

