"""Is growth the steps getting larger, or a site whose keeping stopped? The site window's evidence,
read for the memory-growth rule (torchdoctor/rules/memory.py; why: docs/findings/memory-growth.md).

* Larger steps (:func:`bigger_steps_not_a_leak`): the window watched the series grow (at least
  WINDOW_SEEN of the fitted growth) but what outlived its step explains less than SURVIVOR_SHARE of
  it, and on the host the live CPU tensors grew with it: a growing batch or sequence length.
* A site that stopped (:func:`stopped_sites`): the window is recorded once, early; a site it saw
  keeping S bytes a step stopped when the series after the window rises by less than
  STOPPED_SHARE * S a step (a cache that filled while the window watched). It names nothing, and
  the growth after it is larger steps when the rest of the survivors is small and the activations
  saved for backward (measured at every step by the memory probe) grew by at least WINDOW_SEEN of
  the fitted slope; where they are not measured (checkup), the host's passing tensors in the
  window (each step's batch, outputs and loss, alive at its end and freed later) must have.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.memory import growth
from torchdoctor.memory.trend import MIN_POINTS, theil_sen

WINDOW_SEEN = 0.5  # the site window saw at least this share of the expected growth...
SURVIVOR_SHARE = 0.25  # ...but survivors explain less than this share of it per step
# A site the window saw keeping S bytes/step has stopped when memory after the window rises by
# less than this share of S per step (a cache that filled while the window watched): it names
# nothing, and the growth after it is judged by whether the step's own tensors grew with it.
STOPPED_SHARE = 0.5


def window_sites(w: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return (w.get("cuda_sites") or w.get("tensor_sites") or []) if key.startswith("cuda") \
        else (w.get("tensor_sites") or w.get("python_sites") or [])


def stopped_sites(ev: Evidence, s) -> tuple[list[dict[str, Any]], float | None]:
    """(sites whose keeping stopped, slope of the series after the window). A site the window saw
    keeping S bytes per step stopped when the series after the window (>= TAIL_MIN_POINTS
    samples) rises by less than STOPPED_SHARE * S per step: were it still keeping, memory would
    rise at least that fast. A cache that filled while the window watched, then only read."""
    w = ev.last("mem_sites")
    if not w or w.get("graph_growth"):
        return [], None
    last = w["steps"][1]
    pts = [(x, y) for x, y in zip(s.steps, s.values) if x > last]
    if len(pts) < growth.TAIL_MIN_POINTS:
        return [], None
    after, _ = theil_sen([p[0] for p in pts], [p[1] for p in pts])
    return [x for x in window_sites(w, s.key) if x.get("site") != "(no user frame)"
            and float(x.get("bytes_per_step") or 0) > 0
            and after < STOPPED_SHARE * float(x["bytes_per_step"])], after


def bigger_steps_not_a_leak(ev: Evidence, s, fit) -> bool:
    """True when the site window watched the series grow but nothing it allocated outlived its
    step and no graph grew: the step's own tensors are getting larger (growing sequence
    length, curriculum), nothing accumulates. On the host the Python-visible tensors must
    also have grown by at least half as much (else the growth is outside torch: a leak)."""
    w = ev.last("mem_sites")
    if not w or w.get("partial") or w.get("graph_growth"):
        return False
    stopped, _ = stopped_sites(ev, s)
    if stopped:
        return _bigger_steps_after_a_fill(ev, s, fit, w, stopped)
    first, last = w["steps"]
    by_step = dict(zip(s.steps, s.values))
    after = next((t for t in sorted(by_step) if t >= last), None)  # heap: window samples left out
    if first - 1 not in by_step or after is None or after > last + 2:
        return False
    grown = by_step[after] - by_step[first - 1]
    if grown < WINDOW_SEEN * fit.slope * (after - first + 1):
        return False  # the growth did not happen while the window watched
    surv = w.get("cuda_survivor_bytes") if s.key.startswith("cuda") else w.get("tensor_survivor_bytes")
    if surv is None or surv / max(1, last - first) >= SURVIVOR_SHARE * fit.slope:
        return False
    if s.key.startswith("cuda"):
        return True
    live = w.get("cpu_tensor_bytes_change")  # a gc scan before and after (older runs)
    if live is not None:
        return live >= WINDOW_SEEN * grown
    per_step = w.get("cpu_tensor_bytes_per_step")  # the window's own tensors
    return per_step is not None and per_step >= WINDOW_SEEN * grown / (after - first + 1)


def _bigger_steps_after_a_fill(ev: Evidence, s, fit, w: dict[str, Any], stopped: list[dict[str, Any]]) -> bool:
    """The window watched a fill that stopped (``stopped``), not the growth that went on after
    it: what else survived must still be small, and the step's own tensors must have grown with
    the memory over the fitted steps (the activations saved at the start of backward, measured at
    every step, rising by at least WINDOW_SEEN of the fitted slope: a growing batch or sequence)."""
    surv = w.get("cuda_survivor_bytes") if s.key.startswith("cuda") else w.get("tensor_survivor_bytes")
    if surv is None:
        return False
    first, last = w["steps"]
    rest = max(0.0, surv - sum(float(x.get("bytes") or 0) for x in stopped))
    if rest / max(1, last - first) >= SURVIVOR_SHARE * fit.slope:
        return False
    act = [(int(m["step"]), (m.get("bwd") or {}).get("act")) for m in ev.of("mem")]
    act = [(x, float(a)) for x, a in act if a is not None and fit.first_step <= x <= fit.last_step]
    if len(act) >= MIN_POINTS:
        grew, _ = theil_sen([x for x, _ in act], [a for _, a in act])
        return grew >= WINDOW_SEEN * fit.slope
    # activations not measured (checkup): on the host, the window's passing tensors (what each
    # step held at its end and a later step freed) must have grown as fast
    passing = w.get("cpu_step_tensor_growth")
    return (not s.key.startswith("cuda") and passing is not None
            and float(passing) >= WINDOW_SEEN * fit.slope)
