"""The profiler window's plan (part of :mod:`torchdoctor.instruments.profile.profiler_window`, whose
module doc explains the budget): how many steps to wait, warm up and record, the Python-call
budget of the active steps (:func:`plan_budget`, counted by :class:`_CallCounter`), and how
the analysis tells the user's files from libraries (:func:`make_sources`).
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT_SKIP, DEFAULT_WARMUP, DEFAULT_ACTIVE = 5, 1, 3
DEFAULT_TRACE_MAX_MB = 256
# Python calls (calls + C calls of the main thread) the window may record: post-processing
# costs ~15-25 µs per recorded call on the loaded 2-core box (57k calls: 0.2 s stop + 0.7 s
# flatten); 30k keeps cpu_slow_python (8.6k calls a step) at 3 steps, vae (15.9k) at one
PY_EVENT_BUDGET = 30_000
STACK_OFF_FACTOR = 4  # one step above this many budgets: record without Python stacks


def plan_budget(py_calls_per_step: int | None, active: int,
                budget: int | None = None) -> dict[str, Any]:
    """Active steps and Python stacks that fit the window's budget of recorded Python calls.

    ``py_calls_per_step``: Python calls counted in one un-profiled step (None: not counted;
    the plan is left as it is). Returns {"active", "with_stack", "py_calls_per_step",
    "budget", "reason"?}.
    """
    budget = PY_EVENT_BUDGET if budget is None else budget
    plan: dict[str, Any] = {"active": active, "with_stack": True, "budget": budget,
                            "py_calls_per_step": py_calls_per_step}
    if not py_calls_per_step or py_calls_per_step * active <= budget:
        return plan
    if py_calls_per_step > STACK_OFF_FACTOR * budget:
        plan.update(active=1, with_stack=False,
                    reason=f"{py_calls_per_step} Python calls per step: recorded without Python "
                           f"stacks (over {STACK_OFF_FACTOR} x the budget of {budget})")
    else:
        fit = max(1, budget // py_calls_per_step)
        plan.update(active=min(active, fit),
                    reason=f"{py_calls_per_step} Python calls per step: {min(active, fit)} active "
                           f"step(s) fit the budget of {budget}")
    return plan


class _CallCounter:
    """Counts the main thread's Python calls over one step (``sys.setprofile``; only when no
    other profile function is set, and removed only if still ours)."""

    def __init__(self) -> None:
        import sys

        self.n = 0
        self.on = False
        if sys.getprofile() is None:
            sys.setprofile(self._fn)
            self.on = True

    def _fn(self, frame: Any, event: str, arg: Any) -> None:
        self.n += 1

    def stop(self) -> int | None:
        import sys

        if not self.on:
            return None
        self.on = False
        if sys.getprofile() == self._fn:
            sys.setprofile(None)
            return self.n // 2  # call + return (c_call + c_return)
        return None  # the script set its own profile function meanwhile: no estimate


def plan_window(options: dict[str, Any]) -> tuple[int, int, int]:
    """(wait, warmup, active) steps: defaults, shrunk so the window fits within ``steps``."""
    active = max(1, int(options.get("profile_active") or DEFAULT_ACTIVE))
    warmup = max(0, int(options.get("profile_warmup", DEFAULT_WARMUP)))
    skip = options.get("profile_skip")
    wait = DEFAULT_SKIP if skip is None else max(0, int(skip))
    steps = options.get("steps")
    if steps:
        steps = int(steps)
        active = min(active, max(1, steps - warmup))
        if skip is None:
            wait = max(0, min(wait, steps - warmup - active))
    return wait, warmup, active


def make_sources(extra_paths: tuple[str, ...] = ()):
    """A :class:`Sources` that resolves the tracer's file names and tells the user's files.

    The Python tracer records file names relative to the ``sys.path`` entry they were found
    under ("train.py", "torch/nn/modules/module.py"); they are resolved against ``sys.path``
    (the script's folder is ``sys.path[0]`` in the child; ``extra_paths`` are searched first)
    and judged with the runner's
    :func:`~torchdoctor.runner.frames.is_user_file`, so "user code" means the same everywhere.
    """
    import linecache
    import sys

    import torchdoctor
    from torchdoctor.instruments.profile._profile_analysis import Sources
    from torchdoctor.runner.frames import is_user_file

    tool_root = os.path.realpath(os.path.dirname(torchdoctor.__file__)) + os.sep
    cwd = os.getcwd()
    search = list(extra_paths) + [p or cwd for p in sys.path]
    cache: dict[str, str | None] = {}

    def resolve(name: str) -> str | None:
        if name in cache:
            return cache[name]
        full = None
        if name and not name.startswith("<"):
            if os.path.isabs(name):
                full = name
            else:
                for p in search:
                    cand = os.path.join(p, name)
                    if os.path.isfile(cand):
                        full = os.path.abspath(cand)
                        break
        cache[name] = full
        return full

    def is_user(name: str) -> bool:
        full = resolve(name)
        return full is not None and is_user_file(full)

    def is_tool(name: str) -> bool:
        full = resolve(name)
        return full is not None and os.path.realpath(full).startswith(tool_root) and not is_user_file(full)

    def show(name: str) -> str:
        full = resolve(name)
        if not full:
            return name
        rel = os.path.relpath(full, cwd)
        return full if rel.startswith("..") else rel

    def code(name: str, line: int) -> str:
        full = resolve(name)
        return linecache.getline(full, line).strip()[:160] if full and line else ""

    return Sources(is_user=is_user, show=show, code=code, is_tool=is_tool)
