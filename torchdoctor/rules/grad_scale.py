"""Gradient scale rules: exploding gradient norms and float16 trained without loss scaling.

Pure functions of the evidence written by ``instruments/nan/nan_monitor.py`` (``numerics``,
``grad_norm_overflow``) and ``instruments/training/training_modes.py`` (``amp``). The thresholds are the
constants declared with each code below (why these values: ``docs/findings/<code>.md``).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.numerics import NAN_PROBES, as_float, grad_norm_series, monitor_ran
from torchdoctor.skills import DEBUGGING, MIXED_PRECISION

# gradient-explosion thresholds (see docs/findings/gradient-explosion.md)
MIN_NORMS = 6  # finite grad norms needed to judge a trend
GROWTH_RATIO = 1e3  # max norm / early median: "orders of magnitude"
SPIKE_RATIO = 100.0  # one norm / median of the previous SPIKE_WINDOW norms
SPIKE_WINDOW = 10
SPIKE_MIN_HISTORY = 5

GRADIENT_EXPLOSION = declare(
    "gradient-explosion", DEBUGGING, "warning",
    "gradient norm grows by orders of magnitude or spikes before divergence",
    thresholds={"MIN_NORMS": MIN_NORMS, "GROWTH_RATIO": GROWTH_RATIO, "SPIKE_RATIO": SPIKE_RATIO,
                "SPIKE_WINDOW": SPIKE_WINDOW, "SPIKE_MIN_HISTORY": SPIKE_MIN_HISTORY})
FP16_WITHOUT_SCALER = declare("fp16-without-scaler", MIXED_PRECISION, "warning",
                              "float16 autocast backward without a GradScaler")


# ---------------------------------------------------------------------------- explosion
def judge_explosion(norms: list[tuple[int, float | None]]) -> dict[str, Any] | None:
    """Evidence of an exploding gradient norm in ``[(step, norm)]``, or None.

    Only finite norms before the first non-finite one count. Growth: the largest norm after
    the first ``k`` (k = max(3, n // 5)) is ≥ ``GROWTH_RATIO`` × the median of those first k.
    Spike: one norm ≥ ``SPIKE_RATIO`` × the median of the ``SPIKE_WINDOW`` norms before it.
    """
    finite: list[tuple[int, float]] = []
    first_bad = None
    for step, n in norms:
        if n is None:
            continue
        if not math.isfinite(n):
            first_bad = step
            break
        finite.append((step, n))
    if len(finite) < MIN_NORMS:
        return None
    vals = [n for _s, n in finite]
    k = max(3, len(vals) // 5)
    base = statistics.median(vals[:k])
    floor = max(base, 1e-12)
    imax = max(range(k, len(vals)), key=lambda i: vals[i])
    growth = vals[imax] / floor
    spike = None
    for i in range(SPIKE_MIN_HISTORY, len(vals)):
        prev = vals[max(0, i - SPIKE_WINDOW):i]
        med = max(statistics.median(prev), 1e-12)
        if vals[i] / med >= SPIKE_RATIO:
            spike = (finite[i][0], vals[i], vals[i] / med)
            break
    if growth < GROWTH_RATIO and spike is None:
        return None
    onset = next((finite[i][0] for i in range(k, len(vals)) if vals[i] >= 10 * floor), None)
    out: dict[str, Any] = {
        "early_median_norm": _g(base), "early_steps": f"{finite[0][0]}-{finite[k - 1][0]}",
        "max_norm": _g(vals[imax]), "max_step": finite[imax][0], "growth": f"{growth:.3g}x",
        "above_10x_from_step": onset,
        "last_norms": [f"step {s}: {n:.3g}" for s, n in finite[-6:]],
    }
    if spike is not None:
        out["spike"] = f"step {spike[0]}: {spike[1]:.3g} = {spike[2]:.3g}x the median of the steps before"
    if first_bad is not None:
        out["nonfinite_from_step"] = first_bad
    return out


def _g(x: float) -> float:
    return float(f"{x:.4g}")


@rule("gradient-explosion", probes=NAN_PROBES,
      needs={"numerics", "grad_norm_overflow", "nan_monitor", "nonfinite"},
      raises=[GRADIENT_EXPLOSION])
def gradient_explosion(ev: Evidence) -> list[Finding]:
    series = grad_norm_series(ev)
    overflow = ev.of("grad_norm_overflow")
    if not series and not overflow:
        monitor_ran(ev)
        raise NotApplicable("no gradient norm was measured (no optimizer step with gradients)")
    if all(len([n for _s, n in s if n is not None and math.isfinite(n)]) < MIN_NORMS
           for s in series.values()) and not overflow:
        raise NotApplicable(f"fewer than {MIN_NORMS} steps with gradients: no trend to judge")
    out = []
    for opt, norms in sorted(series.items()):
        evd = judge_explosion(norms)
        if evd is None:
            continue
        if len(series) > 1:
            evd = {"optimizer": opt, **evd}
        growth = evd["growth"]
        where = (f"from step {evd['above_10x_from_step']}" if evd.get("above_10x_from_step")
                 else f"at step {evd['max_step']}")
        title = (f"gradient norm exploded {where}: {evd['early_median_norm']:.3g} early, "
                 f"{evd['max_norm']:.3g} at step {evd['max_step']} ({growth})")
        if "spike" in evd and float(growth.rstrip("x")) < GROWTH_RATIO:
            title = f"gradient norm spiked at {evd['spike']}"
        if evd.get("nonfinite_from_step"):
            title += f", then non-finite at step {evd['nonfinite_from_step']}"
        out.append(finding("gradient-explosion", title, evd, fix=(
            "Clip the gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0) "
            "between backward and step); lower the learning rate or add warmup; check for a "
            "loss scale that grows (unnormalised sums instead of means), and for missing "
            "normalisation layers in deep stacks")))
    if not out and overflow:
        o = overflow[0]
        norm = f" ({as_float(o['norm']):.3g})" if o.get("norm") is not None else ""
        out.append(finding("gradient-explosion",
                           f"gradient norm{norm} overflowed float32 at step {o.get('step')} "
                           f"although every gradient element was finite",
                           {"step": o.get("step"), "norm": o.get("norm")},
                           fix="Clip the gradient norm and lower the learning rate"))
    return out


# ---------------------------------------------------------------------------- float16
@rule("fp16-without-scaler", probes=NAN_PROBES, needs={"amp"}, raises=[FP16_WITHOUT_SCALER])
def fp16_without_scaler(ev: Evidence) -> list[Finding]:
    amp = ev.last("amp")
    if amp is None:
        raise NotApplicable("the mixed-precision watch did not report")
    fp16 = int(amp.get("fp16_backwards") or 0)
    params16 = bool(amp.get("fp16_params"))
    if not fp16 and not params16:
        raise NotApplicable("no float16 autocast region before a backward, no float16 parameters")
    unscaled = int(amp.get("unscaled_fp16_backwards") or 0)
    scaled = int(amp.get("scaled_backwards") or 0)
    if not ((fp16 and unscaled and not scaled) or (params16 and not scaled)):
        return []
    evidence: dict[str, Any] = {"fp16_backwards": fp16, "unscaled_backwards": unscaled,
                                "first_step": amp.get("first_unscaled_step"),
                                "autocast_devices": amp.get("devices")}
    if params16:
        evidence["fp16_params"] = True
    if amp.get("scaler_disabled"):
        evidence["grad_scaler"] = "created with enabled=False"
    what = "float16 autocast" if fp16 else "float16 parameters"
    n = unscaled if fp16 else "every"
    title = (f"{what} trained without loss scaling: {n} backward pass(es) from step "
             f"{amp.get('first_unscaled_step')} ran without a GradScaler")
    return [finding("fp16-without-scaler", title, evidence, fix=(
        "Use torch.amp.GradScaler: scaler.scale(loss).backward(); scaler.step(optimizer); "
        "scaler.update() (small gradients underflow to zero in float16 without it); or train "
        "in bfloat16 (torch.autocast(device, dtype=torch.bfloat16)), which needs no scaler"))]
