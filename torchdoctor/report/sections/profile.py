"""Console section: the profiler window — GPU busy share, top ops, top kernels, hotspots.

Drawn from ``report.metrics['profile']``; the step-time breakdown bar is the steps section's.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchdoctor.report.sections import section

BAR = 30
NAME_W = 56


def _bar(share: float) -> Text:
    n = max(0, min(BAR, round(share * BAR)))
    return Text("█" * n + "·" * (BAR - n), style="cyan" if share >= 0.5 else "yellow")


def _short(name: str, width: int = NAME_W) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _head(m: dict) -> Text:
    steps = m.get("steps") or []
    span = f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else (f"step {steps[0]}" if steps else "no step")
    t = Text(f"Profiler window: {span} recorded", style="bold")
    if m.get("warmup") is not None and m.get("wait") is not None:
        t.append(f" after {m['wait'] + m['warmup']} warm-up steps", style="bold")
    if m.get("status") == "partial":
        t.append(" (the run ended inside the window)", style="yellow")
    for why in (m.get("budget"), m.get("stopped_early")):
        if why:  # torchdoctor's own measurements: no untrusted text
            t.append(f"\n  window cost bounded: {why}", style="dim")
    return t


def _busy_line(m: dict) -> Text | None:
    if m.get("gpu_busy_share") is None:
        host = m.get("host") or {}
        if m.get("step_ms") and host:
            return Text(f"host: torch ops {host.get('ops_ms', 0):.3g} ms, Python and other "
                        f"{host.get('python_ms', 0):.3g} ms per profiled step "
                        f"(un-profiled step {m['step_ms']:.3g} ms)", style="dim")
        return None
    share = float(m["gpu_busy_share"])
    t = Text("GPU busy  ")
    t.append_text(_bar(share))
    t.append(f"  {share:.0%} of a {m['step_ms']:.3g} ms step ({m.get('gpu_busy_ms', 0):.3g} ms of "
             f"kernels and copies; {m.get('kernels_per_step', 0):g} kernels/step, median "
             f"{m.get('median_kernel_us', 0):g} µs)")
    return t


def _ops_table(m: dict) -> Table | None:
    rows = m.get("top_ops") or []
    if not rows:
        return None
    by_dev = m.get("top_ops_by") == "device"
    t = Table(title="Top ops by " + ("GPU time" if by_dev else "self CPU time") + " (per step)",
              title_justify="left", title_style="bold", show_edge=False, pad_edge=False, min_width=64)
    t.add_column("op")
    t.add_column("calls", justify="right")
    t.add_column("self CPU ms", justify="right")
    if by_dev:
        t.add_column("GPU ms", justify="right")
    for r in rows[:8]:
        row = [_short(r["name"]), f"{r['calls']:g}", f"{r['self_cpu_ms']:.3g}"]
        if by_dev:
            row.append(f"{r['device_ms']:.3g}")
        t.add_row(*row)
    return t


def _kernels_table(m: dict) -> Table | None:
    rows = m.get("top_kernels") or []
    if not rows:
        return None
    t = Table(title="Top kernels and copies (per step)", title_justify="left", title_style="bold",
              show_edge=False, pad_edge=False, min_width=64)
    t.add_column("kernel")
    t.add_column("calls", justify="right")
    t.add_column("GPU ms", justify="right")
    for r in rows[:6]:
        t.add_row(_short(r["name"]), f"{r['calls']:g}", f"{r['device_ms']:.3g}")
    return t


def _hotspots(m: dict) -> Table | None:
    rows = [r for r in (m.get("python_hotspots") or []) if r.get("self_ms", 0) >= 0.01]
    if not rows or m.get("gpu_busy_share") is not None:
        return None
    t = Table(title="Your Python functions by self time (per profiled step)", title_justify="left",
              title_style="bold", show_edge=False, pad_edge=False, min_width=64)
    t.add_column("function")
    t.add_column("defined at")
    t.add_column("self ms", justify="right")
    for r in rows[:5]:
        t.add_row(r["func"], r["def"], f"{r['self_ms']:.3g}")
    return t


@section("profile", order=30)
def profile_section(report):
    m = report.metrics.get("profile")
    if not m:
        return None
    if m.get("status") not in ("ok", "partial"):
        why = m.get("reason") or m.get("error")
        if m.get("status") == "not-reached" and not why:
            why = (f"the run made {m.get('steps_seen')} steps; the window needs "
                   f"{m.get('steps_needed')} (lower --skip or raise --steps)")
        return Text(f"Profiler window: {m.get('status')}" + (f" — {why}" if why else ""), style="yellow")
    parts = [_head(m)]
    for part in (_busy_line(m), _ops_table(m), _kernels_table(m), _hotspots(m)):
        if part is not None:
            parts.append(part)
    if m.get("trace"):
        parts.append(Text(f"trace: {m['trace']}  (open in https://ui.perfetto.dev)", style="dim"))
    elif m.get("trace_dropped"):
        parts.append(Text(f"trace not kept: {m['trace_dropped']}", style="dim"))
    return Group(*parts)
