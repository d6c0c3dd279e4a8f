"""A trial's verdict from its numbers: pure functions (no torch, no I/O), unit-tested.

**Loss check** (:func:`loss_check`). torchdoctor never seeds: the script's own seeds make two
runs comparable. The baseline's rounds are compared with each other first: when they already
differ (drift > 0), the script is not reproducible and a treated run is allowed
``NONREPRO_FACTOR`` × that drift (or the treatment's tolerance, whichever is larger) — the
check then says so. A treated run's drift is its largest relative per-step difference from the
first baseline round, relative to ``max(|a|, |b|, LOSS_FLOOR × the largest baseline loss)`` (a
loss near zero late in training is judged against the loss scale, not against itself). A
non-finite loss where the baseline's was finite fails the check.

**Verdict** (:func:`verdict`), first match wins:

1. ``failed``: the treated run did not train (crash, timeout, a treatment that raised) — the
   error is the reason;
2. ``reject``: the loss check failed (drift beyond the tolerance, non-finite loss);
3. ``reject``: peak memory grew by more than ``MEM_BLOWUP`` (and the trial is not about memory);
4. speed trials — ``adopt``: speed-up ≥ 1 + band; ``reject``: speed-up ≤ 1 / (1 + band)
   ("slower"); else ``noise``. The band is the larger spread of the two sides' round medians,
   at least ``MIN_NOISE`` (2 %), and at least ``SINGLE_ROUND_NOISE`` when a side has one round;
5. memory trials — ``adopt`` when the baseline ran out of memory and the treated run did not, or
   the peak fell by ≥ ``MEM_SAVED`` at a slowdown within the band or within ``MEM_SLOWDOWN_MAX``
   (the cost is stated in the reason); ``reject`` when slower beyond both; else ``noise``.

``skipped`` (with the reason) is decided before any run, by the plan.
"""

from __future__ import annotations

from typing import Any, Sequence

from torchdoctor.trials.compare import first_nonfinite, loss_drift

NONREPRO_FACTOR = 2.0
LOSS_FLOOR = 1e-3
MEM_BLOWUP = 0.20
MEM_SAVED = 0.05
MEM_SLOWDOWN_MAX = 0.10  # a memory trial that saves memory may cost up to this much speed
SINGLE_ROUND_NOISE = 0.10
VERDICTS = ("adopt", "noise", "reject", "failed", "skipped")


def _finite_abs(xs: Sequence) -> list[float]:
    out = []
    for x in xs:
        try:
            v = abs(float(x))
        except (TypeError, ValueError):
            continue
        if v == v and v != float("inf"):
            out.append(v)
    return out


def loss_check(base_rounds: Sequence[Sequence], treated_rounds: Sequence[Sequence],
               tolerance: float) -> dict[str, Any]:
    """{ok: True|False|None, max_rel_diff, allowed, baseline_drift, reproducible, steps, note}.

    ``ok`` is None when no step has a loss on both sides (nothing to compare)."""
    base = [list(r) for r in base_rounds if r]
    treated = [list(r) for r in treated_rounds if r]
    out: dict[str, Any] = {"ok": None, "max_rel_diff": None, "allowed": tolerance,
                           "baseline_drift": None, "reproducible": None, "steps": 0, "note": ""}
    if not base or not treated:
        out["note"] = "no loss recorded on one side: the loss was not compared"
        return out
    ref = base[0]
    scale = max(_finite_abs(ref), default=0.0)
    floor = LOSS_FLOOR * scale
    drifts = [loss_drift(ref, r, floor)[0] for r in base[1:]]
    drifts = [d for d in drifts if d is not None]
    if drifts:
        bd = max(drifts)
        out["baseline_drift"] = bd
        out["reproducible"] = bd == 0.0
        if bd > 0.0:
            out["allowed"] = max(tolerance, NONREPRO_FACTOR * bd)
            out["note"] = (f"the baseline's own rounds differ (loss up to {bd:.2g} relative): the "
                           f"script is not reproducible run to run, so the treated loss is allowed "
                           f"{NONREPRO_FACTOR:g}x that drift")
    worst, n = None, 0
    for r in treated:
        d, k = loss_drift(ref, r, floor)
        n = max(n, k)
        if d is not None:
            worst = d if worst is None else max(worst, d)
    out["steps"] = n
    if worst is None:
        out["note"] = (out["note"] + "; " if out["note"] else "") + "no step with a loss on both sides"
        return out
    out["max_rel_diff"] = worst
    bad = [s for s in (first_nonfinite(r) for r in treated) if s is not None]
    if bad and first_nonfinite(ref) is None:
        out["ok"] = False
        out["note"] = (out["note"] + "; " if out["note"] else "") + f"non-finite loss at step {min(bad)}"
        return out
    out["ok"] = worst <= out["allowed"]
    return out


def band_of(base_spread: float | None, treated_spread: float | None, base_rounds: int,
            treated_rounds: int, min_noise: float) -> float:
    b = max([min_noise, *[s for s in (base_spread, treated_spread) if s is not None]])
    if min(base_rounds, treated_rounds) < 2:
        b = max(b, SINGLE_ROUND_NOISE)
    return b


def verdict(*, intent: str, speedup: float | None, band: float, loss_ok: bool | None,
            loss_note: str = "", max_rel_diff: float | None = None, allowed: float | None = None,
            peak_before: float | None = None, peak_after: float | None = None,
            failure: str | None = None, baseline_oom: bool = False) -> tuple[str, str]:
    """(verdict, reason) of one trial; see the module docstring for the rules."""
    if failure:
        return "failed", failure
    if loss_ok is False:
        if max_rel_diff is not None and allowed is not None and max_rel_diff > allowed:
            return "reject", f"loss drift {max_rel_diff:.3g} > {allowed:.3g} allowed" + (
                f" ({loss_note})" if loss_note else "")
        return "reject", loss_note or "the loss check failed"
    grew = (peak_before and peak_after is not None and peak_after > peak_before * (1 + MEM_BLOWUP))
    if intent == "memory":
        if baseline_oom:
            return "adopt", "the baseline ran out of memory; the treated run did not"
        slower = speedup is not None and speedup <= 1 / (1 + band)
        if peak_before and peak_after is not None and peak_after <= peak_before * (1 - MEM_SAVED):
            saved = f"peak memory {1 - peak_after / peak_before:.0%} lower"
            if not slower:
                return "adopt", saved
            if speedup >= 1 / (1 + MEM_SLOWDOWN_MAX):
                return "adopt", f"{saved}, at {speedup:.2f}x the speed"
        if slower:
            return "reject", f"slower: {speedup:.2f}x (noise band ±{band:.0%})"
        if grew:
            return "reject", f"peak memory {peak_after / peak_before - 1:+.0%}"
        return "noise", "no memory saved beyond " f"{MEM_SAVED:.0%}"
    if grew:
        return "reject", f"peak memory {peak_after / peak_before - 1:+.0%} (more than {MEM_BLOWUP:.0%})"
    if speedup is None:
        return "noise", "no step time to compare"
    if speedup >= 1 + band:
        return "adopt", f"{speedup:.2f}x faster (noise band ±{band:.0%})"
    if speedup <= 1 / (1 + band):
        return "reject", f"slower: {speedup:.2f}x (noise band ±{band:.0%})"
    return "noise", f"{speedup:.2f}x is within the noise band ±{band:.0%}"
