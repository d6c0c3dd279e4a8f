"""Comparing trial runs: pure functions of numbers (no torch, no I/O).

* A run's step time is the **median** of its judged steps (warm-up left out); over several
  rounds of the same variation, the median of the round medians.
* **Spread** of one variation: (max − min) / median of its round medians — how much the same
  thing varies from run to run on this machine now.
* **Noise band** of a comparison: the larger spread of the two sides (at least
  ``MIN_NOISE``): a speed-up inside it is not a measured effect.
* **Speed-up**: baseline median / treated median (> 1: the treatment is faster).
* **Loss drift**: the largest relative difference of the per-step losses over the steps both
  runs have, ``|a − b| / max(|a|, |b|, floor)`` (``floor`` defaults to ``LOSS_EPS``; a caller may
  pass the loss scale, so that a loss near zero late in training is not judged relative to
  itself); a step where exactly one side is non-finite counts as infinite drift.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

MIN_NOISE = 0.02  # below 2 % no difference is called measured, whatever the rounds say
LOSS_EPS = 1e-12


def median(values: Iterable[float]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return statistics.median(v) if v else None


def round_medians(rounds: Sequence[Sequence[float]]) -> list[float]:
    """The median step time of each round that measured at least one step."""
    return [m for m in (median(r) for r in rounds) if m is not None]


def spread(medians: Sequence[float]) -> float | None:
    """(max − min) / median of round medians; 0.0 for one round, None for none."""
    if not medians:
        return None
    mid = statistics.median(medians)
    return (max(medians) - min(medians)) / mid if mid > 0 else None


def noise_band(base_medians: Sequence[float], treated_medians: Sequence[float]) -> float:
    sp = [s for s in (spread(base_medians), spread(treated_medians)) if s is not None]
    return max([MIN_NOISE, *sp])


def speedup(base_medians: Sequence[float], treated_medians: Sequence[float]) -> float | None:
    b, t = median(base_medians), median(treated_medians)
    if b is None or t is None or t <= 0:
        return None
    return b / t


def _num(x) -> float:
    return float(x)  # also "nan", "inf", "-inf" from the trial trace


def loss_drift(base: Sequence, treated: Sequence, floor: float = LOSS_EPS) -> tuple[float | None, int]:
    """(largest relative difference, steps compared); (None, 0) when no step has both."""
    worst: float | None = None
    n = 0
    for a, b in zip(base, treated):
        if a is None or b is None:
            continue
        a, b = _num(a), _num(b)
        n += 1
        fa, fb = math.isfinite(a), math.isfinite(b)
        if not (fa and fb):
            d = 0.0 if (not fa and not fb) else math.inf
        else:
            d = abs(a - b) / max(abs(a), abs(b), floor, LOSS_EPS)
        worst = d if worst is None else max(worst, d)
    return worst, n


def first_nonfinite(losses: Sequence) -> int | None:
    """The 1-based step of the first non-finite loss, or None."""
    for i, v in enumerate(losses, 1):
        if v is not None and not math.isfinite(_num(v)):
            return i
    return None
