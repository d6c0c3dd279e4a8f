"""Views of the profiler window's evidence that the profile rules and the ``profile`` and
``flops`` metrics both read: what kept the window from its steps, which steps it touched, and
the step time of the steps it did not touch (pure: Evidence in, numbers out)."""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.evidence import Evidence, step_seconds
from torchdoctor.evidence.steps import counted_steps


def not_reached(w: dict[str, Any]) -> str:
    """What kept the window from its steps, in words (issue 27: say what really happened)."""
    seen, need = int(w.get("steps_seen") or 0), w.get("steps_needed")
    if seen:
        return (f"the run completed {seen} training steps; the profiler window needs {need} "
                f"(lower --skip or raise --steps)")
    stepped = w.get("optimizers_stepped")
    if stepped:  # optimizers stepped, yet no step boundary: a cycle of several never learned
        return (f"{stepped} optimizers stepped but no training step was completed: with several "
                f"optimizers a step ends once their cycle is known (the first comes back after the "
                f"others, or one steps 9 times), and the run ended first; the window needs {need} steps")
    return (f"no optimizer step was seen (the script never called optimizer.step(), or the run ended "
            f"before training began); the window needs {need} steps")


def touched_steps(w: dict[str, Any]) -> set[int]:
    """Steps whose wall time the profiler changed: the counted step, warm-up, active, the one after."""
    first = int(w.get("first_step") or 1)
    # the step before the warm-up counted the Python calls for the budget (a profile function)
    counted = 1 if (w.get("budget") or {}).get("py_calls_per_step") else 0
    return set(range(first - int(w.get("warmup", 1)) - counted, first + int(w.get("active", 1)) + 1))


def bare_clock(ev: Evidence, w: dict[str, Any]) -> dict[str, Any] | None:
    """Median step time (ms) and data-wait share of the un-profiled steps (step 1 left out);
    None when no step time was measured.

    Falls back to the profiled steps when the run had no other step (``source``: "profiled").
    """
    steps = ev.of("step")
    skip = touched_steps(w) | counted_steps(ev)  # and the FLOP counter's step
    bare = [s for s in steps if s.get("step") != 1 and s.get("step") not in skip]
    source = "bare"
    if not bare:
        bare = [s for s in steps if s.get("step") in skip] or steps
        source = "profiled"
    if not bare:
        return None
    walls = step_seconds(ev, bare)[0]  # on CUDA: the longer of host wall and device span
    total = sum(walls) or 1e-12
    data = sum(float(s.get("data_s", 0.0)) for s in bare)
    no_data = [w - float(s.get("data_s", 0.0)) for w, s in zip(walls, bare)]
    return {"step_ms": round(statistics.median(walls) * 1e3, 4), "data_share": round(data / total, 4),
            "data_ms": round(data / len(bare) * 1e3, 4), "min_step_ms": round(min(walls) * 1e3, 4),
            "min_step_no_data_ms": round(min(no_data) * 1e3, 4),
            "steps": len(bare), "source": source}
