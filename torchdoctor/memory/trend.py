"""A robust per-step trend: Theil-Sen slope, fit quality, and whether growth persists.

Memory sampled at step boundaries is a step function of what the loop keeps alive. A
leak adds about the same bytes every step (a line); warm-up (optimizer state created at
step 1, caches that fill once) rises and then stays flat (a plateau). So the fit:

* drops the warm-up (the first ``max(3, 10%)`` samples);
* fits a Theil-Sen line (median of pairwise slopes: one-off jumps and outliers do not move it);
* reports R^2 of that line, and the slope of the **last half** alone: a plateau has a late
  slope near 0, a leak keeps its slope to the end.

Pure Python (numpy is not a runtime dependency); long series are thinned to 200 points,
so a fit costs a few milliseconds at most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Sequence

MAX_POINTS = 200
MIN_POINTS = 8


@dataclass(frozen=True)
class Trend:
    slope: float  # bytes per step (Theil-Sen), fitted range
    intercept: float
    r2: float  # of the Theil-Sen line on the fitted points (0 when the series is flat)
    late_slope: float  # Theil-Sen slope of the last half of the fitted points
    first_step: int
    last_step: int
    n: int  # points fitted
    warmup: int  # samples dropped at the start
    xs: tuple = field(default=(), repr=False, compare=False)  # the fitted points (thinned)
    ys: tuple = field(default=(), repr=False, compare=False)

    @property
    def rise(self) -> float:
        """Fitted growth in bytes over the fitted range."""
        return self.slope * (self.last_step - self.first_step)

    def to_dict(self) -> dict:
        return {"bytes_per_step": round(self.slope, 1), "r2": round(self.r2, 3),
                "late_bytes_per_step": round(self.late_slope, 1),
                "steps_fitted": [self.first_step, self.last_step], "points": self.n,
                "warmup_skipped": self.warmup}


def warmup_count(n: int) -> int:
    return max(3, round(0.1 * n))


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line; needs >= 2 points with distinct x."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i])
              for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not slopes:
        return 0.0, float(median(ys)) if ys else 0.0
    b = median(slopes)
    a = median(y - b * x for x, y in zip(xs, ys))
    return float(b), float(a)


def _thin(xs: list[float], ys: list[float], k: int) -> tuple[list[float], list[float]]:
    if len(xs) <= k:
        return xs, ys
    idx = sorted({round(i * (len(xs) - 1) / (k - 1)) for i in range(k)})
    return [xs[i] for i in idx], [ys[i] for i in idx]


def r_squared(xs: Sequence[float], ys: Sequence[float], slope: float, intercept: float) -> float:
    mean = sum(ys) / len(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    if ss_tot <= 0:
        return 0.0
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    return max(0.0, 1.0 - ss_res / ss_tot)


def fit_trend(steps: Sequence[int], values: Sequence[float | int | None],
              warmup: int | None = None) -> Trend | None:
    """Fit the post-warm-up trend of ``values`` sampled at ``steps``; None if too few points."""
    pts = sorted((int(s), float(v)) for s, v in zip(steps, values) if v is not None)
    w = warmup_count(len(pts)) if warmup is None else warmup
    pts = pts[w:]
    if len(pts) < MIN_POINTS:
        return None
    xs, ys = _thin([p[0] for p in pts], [p[1] for p in pts], MAX_POINTS)
    slope, intercept = theil_sen(xs, ys)
    half = len(xs) // 2
    late, _ = theil_sen(xs[half:], ys[half:])
    return Trend(slope=slope, intercept=intercept, r2=r_squared(xs, ys, slope, intercept),
                 late_slope=late, first_step=int(xs[0]), last_step=int(xs[-1]), n=len(xs),
                 warmup=w, xs=tuple(xs), ys=tuple(ys))


def rising(values: Sequence[float], min_step_rise: float) -> bool:
    """Cheap online suspicion test (arms the allocation-site window early): at least 3 in 4
    consecutive differences are rises and the mean rise per sample is >= ``min_step_rise``."""
    if len(values) < 2:
        return False
    diffs = [b - a for a, b in zip(values, values[1:])]
    ups = sum(1 for d in diffs if d > 0)
    return ups >= 0.75 * len(diffs) and sum(diffs) / len(diffs) >= min_step_rise
