"""One growth judgment for every probe: is a per-step memory series a leak, and does it matter?

Used by the ``memory-growth`` rule (probes ``memory`` and ``checkup`` alike: one function, so
both probes reach the same verdict on the same series) and by the memory sampler to decide
whether growth is worth naming its lines (the site window costs time; growth that would not be
reported at warning or above is not worth it).

Two questions, answered apart (docs/findings/memory-growth.md, "How it is measured"):

* **Credible growth** (:func:`credible`): a robust line through the post-warm-up series
  (Theil-Sen slope: one-off jumps and outliers do not move it) that rises enough
  (:data:`GROWTH_MIN_SLOPE`, :data:`GROWTH_MIN_RISE`), rises *consistently* (the share of
  rising pairs among samples at least half the series apart, :data:`GROWTH_MIN_CONSISTENCY`:
  robust to the transient allocations of other instruments, which break an R^2 threshold while
  the slope stays the same) and keeps rising to the end (last half and last quarter,
  :data:`GROWTH_LATE_RATIO`): a bounded queue or a cache that fills and then stays flat is
  not growth.
* **Impact** (:func:`impact`): how soon memory would be full at this rate. Warning when the
  device (or the host's available memory) would be full within the job's horizon
  (:data:`HORIZON_HOURS` of the measured step time; :data:`HORIZON_STEPS` when no step time
  was measured), or when the rate alone is large (:data:`RATE_WARN_PER_HOUR`); error when it
  would be full within :data:`ERROR_HOURS` (:data:`ERROR_STEPS`). Below that: info, so a slow
  bounded-looking rise (18 KiB/step, 7 million steps from full) is never a warning.

Pure: numbers in, a :class:`Verdict` out.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdoctor.memory.trend import Trend, theil_sen
from torchdoctor.memory.units import GiB, KiB, MiB

# ---- credibility (bytes per step, bytes, ratios) --------------------------------------------
GROWTH_MIN_SLOPE = 4 * KiB  # Theil-Sen slope; well above the heap's 0.3 KiB/step noise
NOISY_MIN_SLOPE = 1 * MiB  # RSS (page-granular, 50-360 KiB/step noise), only without the heap counter
GROWTH_MIN_RISE = 128 * KiB  # fitted rise over the judged steps
GROWTH_MIN_CONSISTENCY = 0.8  # share of rising pairs among samples >= half the series apart
GROWTH_LATE_RATIO = 0.5  # last-half and last-quarter slopes must keep this share of the slope
TAIL_MIN_POINTS = 5  # the last-quarter check needs this many samples

# ---- impact (how soon memory is full) ---------------------------------------------------------
HORIZON_HOURS = 24.0  # the job's horizon: a day of training at the measured step time
HORIZON_STEPS = 100_000  # the horizon when no step time was measured
ERROR_HOURS = 1.0  # full within an hour: error
ERROR_STEPS = 10_000  # ... or within this many steps when no step time was measured
RATE_WARN_PER_HOUR = 8 * GiB  # a rate that matters on any machine, whatever the room left

# ---- strength of the evidence -----------------------------------------------------------------
# Growth that nothing names (no tensor outlived its step, no autograd graph grew, no Python line
# allocated it) may be the allocator settling in (first epochs, a test loop's buffers, PIL's
# caches): a short run cannot tell it from a leak, and a 24 h extrapolation of 12 steps is a
# guess. When the site window looked and named nothing, such growth is at most info until it has
# been seen rising over this many steps (rules/memory.py).
UNATTRIBUTED_MIN_STEPS = 100
# A warning or error also needs a line that explains the series: the fitted line's R^2 at least
# FIT_MIN_R2 (a 0.17 fit over a wandering series is no trend to extrapolate 24 h from), and a
# site only names the growth when the bytes it keeps per step are at least SITE_MIN_SHARE of the
# fitted slope (a 32 B/step site does not explain 20 KiB/step). An autograd graph measured growing
# step over step (a kept loss: `total += loss`) is a leak at any rate: at least a warning, whatever
# the step time, with its line.
FIT_MIN_R2 = 0.5
SITE_MIN_SHARE = 0.25
GRAPH_MIN_SEVERITY = "warning"


SEVERITY_ORDER = {None: 0, "info": 1, "warning": 2, "error": 3}


@dataclass(frozen=True)
class Verdict:
    credible: bool
    why_not: str  # why the growth is not credible ("" when it is)
    severity: str | None  # "error" | "warning" | "info" | None (not credible)
    steps_until_full: int | None
    hours_until_full: float | None
    bytes_per_hour: float | None
    horizon: str  # what the severity was measured against, in words


def consistency(xs: list[float], ys: list[float]) -> float:
    """Share of strictly rising pairs among samples at least half the x-range apart.

    A leak under bounded noise rises between any two samples far enough apart; a sawtooth,
    pure noise or a single jump does not (about half of such pairs, or fewer, rise). Spikes
    touch few pairs, so unlike R^2 a handful of transient allocations do not change it."""
    if len(xs) < 2:
        return 0.0
    gap = (xs[-1] - xs[0]) / 2
    up = total = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            if xs[j] - xs[i] >= gap:
                total += 1
                up += ys[j] > ys[i]
    return up / total if total else 0.0


def credible(fit: Trend, noisy: bool = False) -> tuple[bool, str]:
    """Is the fitted series growing (see module docstring)?"""
    xs, ys = list(fit.xs), list(fit.ys)
    min_slope = NOISY_MIN_SLOPE if noisy else GROWTH_MIN_SLOPE
    if fit.slope < min_slope:
        return False, "slope below the floor"
    if fit.rise < GROWTH_MIN_RISE:
        return False, "rise too small"
    if consistency(xs, ys) < GROWTH_MIN_CONSISTENCY:
        return False, "not a consistent rise (sawtooth, noise or a single jump)"
    if fit.late_slope < GROWTH_LATE_RATIO * fit.slope:
        return False, "flat over the last half (warm-up or a bounded buffer that filled)"
    tail = max(TAIL_MIN_POINTS, len(xs) // 4)
    if len(xs) >= 2 * tail:
        t_slope, _ = theil_sen(xs[-tail:], ys[-tail:])
        if t_slope < GROWTH_LATE_RATIO * fit.slope:
            return False, "flat over the last quarter (a bounded queue or cache that filled)"
    return True, ""


def impact(slope: float, room: float | None, step_s: float | None) -> tuple[str, dict]:
    """Severity of a credible growth of ``slope`` bytes/step with ``room`` bytes left and a
    median step time ``step_s`` (either may be unknown), and the numbers behind it."""
    out: dict = {"steps_until_full": None, "hours_until_full": None, "bytes_per_hour": None}
    if step_s and step_s > 0:
        out["bytes_per_hour"] = slope * 3600.0 / step_s
    steps = int(room / slope) if room and room > 0 and slope > 0 else None
    out["steps_until_full"] = steps
    if steps is not None and step_s:
        out["hours_until_full"] = steps * step_s / 3600.0
    if step_s:
        horizon = (f"{HORIZON_HOURS:g} h at the measured {step_s * 1e3:.3g} ms/step "
                   f"({int(HORIZON_HOURS * 3600 / step_s):,} steps)")
        hours = out["hours_until_full"]
        if hours is not None and hours <= ERROR_HOURS:
            return "error", {**out, "horizon": horizon}
        if (hours is not None and hours <= HORIZON_HOURS) or \
                (out["bytes_per_hour"] or 0) >= RATE_WARN_PER_HOUR:
            return "warning", {**out, "horizon": horizon}
        return "info", {**out, "horizon": horizon}
    horizon = f"{HORIZON_STEPS:,} steps (no step time measured)"
    if steps is not None and steps <= ERROR_STEPS:
        return "error", {**out, "horizon": horizon}
    if steps is not None and steps <= HORIZON_STEPS:
        return "warning", {**out, "horizon": horizon}
    return "info", {**out, "horizon": horizon}


def evidence_cap(severity: str | None, r2: float, fitted_steps: int, site_share: float, graph: bool,
                 looked: bool) -> str | None:
    """Why a warning/error must drop to info ("fit" | "unattributed"), or None when it stands.
    ``site_share``: the named sites' bytes per step over the fitted slope; ``graph``: an autograd
    graph measured growing (never capped); ``looked``: the site window ran."""
    if severity not in ("warning", "error") or graph:
        return None
    if r2 < FIT_MIN_R2:
        return "fit"
    if looked and site_share < SITE_MIN_SHARE and fitted_steps < UNATTRIBUTED_MIN_STEPS:
        return "unattributed"
    return None


def with_graph_floor(severity: str | None) -> str | None:
    """A measured growing autograd graph is at least :data:`GRAPH_MIN_SEVERITY`."""
    if SEVERITY_ORDER[severity] < SEVERITY_ORDER[GRAPH_MIN_SEVERITY]:
        return GRAPH_MIN_SEVERITY
    return severity


def judge(fit: Trend, noisy: bool, room: float | None, step_s: float | None) -> Verdict:
    """Credibility, then impact: the one growth judgment of every probe."""
    ok, why = credible(fit, noisy)
    if not ok:
        return Verdict(False, why, None, None, None, None, "")
    sev, nums = impact(fit.slope, room, step_s)
    return Verdict(True, "", sev, nums["steps_until_full"], nums["hours_until_full"],
                   nums["bytes_per_hour"], nums["horizon"])
