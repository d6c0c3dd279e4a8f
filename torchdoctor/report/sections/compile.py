"""Console section: torch.compile's cost and gain — compile time, steady step time, speed-up.

Drawn from ``report.metrics['compile']`` (``pipeline/compile_metrics.py``; the eager figures
come from the ``compile`` command's eager trial). Numbers only: no untrusted text.
"""

from __future__ import annotations

from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.report.sections import section


def compile_lines(m: dict) -> list[str]:
    if not m or not m.get("compiled"):
        return []
    lines = []
    steps = m.get("compile_steps") or []
    head = (f"torch.compile: {m.get('graphs') or 0} graph(s), {m.get('graph_breaks') or 0} graph "
            f"break site(s), {m.get('recompiles') or 0} recompile(s)")
    if m.get("compile_s") is not None:
        head += f"; compiling took {m['compile_s']:.3g} s"
        if steps:
            head += f" in step(s) {', '.join(str(s) for s in steps[:8])}{'…' if len(steps) > 8 else ''}"
    lines.append(head)
    c, e = m.get("compiled_step_ms"), m.get("eager_step_ms")
    if c is not None:
        tail = f"steady step {c:.4g} ms compiled ({m.get('steady_steps', 0)} steps without compiling)"
        if e is not None:
            tail += f" vs {e:.4g} ms eager ({m.get('eager_steps', 0)} steps)"
            if m.get("speedup") is not None:
                tail += f": {m['speedup']:.2f}× " + ("faster" if m["speedup"] >= 1 else "(slower)")
        elif m.get("eager_skipped"):
            tail += f"; eager run: {visible(m['eager_skipped'])}"
        lines.append(tail)
    elif m.get("eager_skipped"):
        lines.append(f"eager run: {visible(m['eager_skipped'])}")
    return lines


@section("compile", order=25)
def compile_section(report) -> Text | None:
    lines = compile_lines(report.metrics.get("compile") or {})
    if not lines:
        return None
    t = Text(lines[0], style="bold")
    for ln in lines[1:]:
        t.append("\n  " + ln)
    return t
