"""The compiled run against the eager run of the same steps (pure: numbers and evidence).

Both sides leave out the warm-up step and every step in which the compiled run compiled
something (those steps hold compile time, reported apart); the eager side keeps the same step
numbers. Speed-up = eager median / compiled median (> 1: compiling made the step faster).
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.evidence import Evidence


def compare_eager(m: dict[str, Any], eager: Evidence, failure: str | None) -> dict[str, Any]:
    """The keys to add to the ``compile`` section: eager_step_ms, eager_steps, speedup (or
    eager_skipped, why there is no comparison)."""
    from torchdoctor.evidence.steps import judged_steps, step_seconds

    if failure:
        return {"eager_skipped": f"the eager run failed: {failure}"}
    c = eager.last("dynamo_counters") or {}
    if c.get("frames_ok") or eager.of("dynamo_compile"):
        return {"eager_skipped": "compilation could not be switched off from outside "
                                 "(dynamo compiled in the eager run)"}
    skip = set(m.get("compile_steps") or [])
    steps = [s for s in judged_steps(eager)
             if int(s.get("step", 0)) not in skip and s.get("wall_s") is not None]
    walls = step_seconds(eager, steps)[0]
    if not walls:
        return {"eager_skipped": "no eager step outside the compiled run's compile steps"}
    e = round(statistics.median(walls) * 1e3, 3)
    out: dict[str, Any] = {"eager_step_ms": e, "eager_steps": len(walls)}
    c = m.get("compiled_step_ms")
    if c:
        out["speedup"] = round(e / c, 3)
    return out
