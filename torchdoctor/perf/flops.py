"""Achieved FLOP/s and MFU from a counted step and a measured step time (pure arithmetic).

- achieved FLOP/s = FLOPs of one step / median step time;
- with FLOPs in several dtype classes (fp32 and bf16 under autocast, say), the peak is the one
  that would do the same FLOPs in the least time at each class's own peak:
  ``peak = total / sum(flops_d / peak_d)`` (for a single class it is that class's peak);
- **MFU = achieved / the card's one fixed peak**: its dense bf16/fp16 tensor-core peak (fp16 where
  the data sheet has no bf16 row), whatever dtypes the step uses, so that a run before and after a
  change of precision (TF32, bf16 autocast) is measured against the same yardstick: a run that got
  five times faster shows a five times higher MFU. The precision's own peak (the mix above) is
  kept as a second figure, ``mfu_dtype_peak``: how close the math runs to what its dtype allows.
- MFU above ``MFU_SUSPECT`` (75%) is flagged (``mfu_suspect``) rather than printed as fact: real
  training steps do not reach it, so a wrong FLOP count or peak is likelier than the figure.

On a CPU there is no MFU: the peak depends on the core count the run may use, the vector units
(AVX2, AVX-512, AMX) and the clocks under load, and no vendor table gives it per machine.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.perf.peaks import card_peak, lookup, peak_flops

MFU_SUSPECT = 0.75

CPU_NO_MFU = ("on a CPU the peak depends on the cores the run may use, the vector units "
              "(AVX2/AVX-512/AMX) and the clocks under load; no vendor table gives it")


def mfu(flops_by_dtype: dict[str, float], step_s: float, device: str, device_name: str | None
        ) -> dict[str, Any]:
    """{achieved_flops_per_s, dtype, peak_flops_per_s, mfu, peak_source} or with ``mfu_reason``."""
    total = float(sum(flops_by_dtype.values()))
    out: dict[str, Any] = {"achieved_flops_per_s": total / step_s if step_s > 0 else None}
    dominant = max(flops_by_dtype, key=lambda d: flops_by_dtype[d]) if flops_by_dtype else None
    out["dtype"] = dominant
    if device != "cuda":
        out["mfu_reason"] = CPU_NO_MFU
        return out
    if total <= 0 or step_s <= 0:
        out["mfu_reason"] = "no FLOPs counted in the step"
        return out
    at_peak_s = 0.0
    for d, n in flops_by_dtype.items():
        if n <= 0:
            continue
        pk, why = peak_flops(device_name, d)
        if pk is None:
            out["mfu_reason"] = why
            return out
        at_peak_s += n / pk
    dtype_peak = total / at_peak_s
    card, card_dtype = card_peak(device_name)
    gp = lookup(device_name)
    out["peak_source"] = f"{gp.key}: {gp.source}" if gp else None
    out["dtype_peak_flops_per_s"] = dtype_peak
    out["mfu_dtype_peak"] = out["achieved_flops_per_s"] / dtype_peak
    if card is None:  # no tensor-core row: the dtype mix's peak is the only yardstick
        card, card_dtype = dtype_peak, "the dtype mix"
    out["peak_flops_per_s"] = card
    out["peak_dtype"] = card_dtype
    out["mfu"] = out["achieved_flops_per_s"] / card
    if out["mfu"] > MFU_SUSPECT:
        out["mfu_suspect"] = (f"MFU {out['mfu']:.0%} is above {MFU_SUSPECT:.0%}, more than real "
                              "training steps reach: the FLOP count or the peak is likelier wrong")
    return out
