"""gemm-unaligned: big matmuls with a dimension off the tensor cores' 16-byte alignment, judged
by the FLOP rate they reached against the aligned matmuls of the same steps (evidence:
``profile_gemm_shapes``, torchdoctor/instruments/profile/_profile_gemm.py; why these values:
docs/findings/gemm-unaligned.md)."""

from __future__ import annotations

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.profile import PROBES, _pct, _site_line, gpu_window
from torchdoctor.skills import PERFORMANCE

UNALIGNED_SHARE_MIN = 0.10  # the unaligned matmuls take at least this share of GPU busy time...
UNALIGNED_RATE_MAX = 0.5  # ...at most this share of the aligned matmuls' FLOP rate

GEMM_UNALIGNED = declare(
    "gemm-unaligned", PERFORMANCE, "warning",
    "big matmuls with a dimension that is not a multiple of 8 (16-bit) or 4 (float32) run on slow kernels",
    thresholds={"UNALIGNED_SHARE_MIN": UNALIGNED_SHARE_MIN, "UNALIGNED_RATE_MAX": UNALIGNED_RATE_MAX})


@rule("gemm-unaligned", probes=PROBES,
      needs={"profile_window", "profile_device", "profile_gemm_shapes", "step"}, raises=[GEMM_UNALIGNED])
def gemm_unaligned(ev: Evidence) -> list[Finding]:
    _w, dev = gpu_window(ev)
    g = ev.last("profile_gemm_shapes")
    if g is None:
        raise NotApplicable("no matmul shapes were recorded")
    odd_ms, odd_rate = float(g.get("unaligned_ms") or 0.0), g.get("unaligned_tflops")
    even_rate = g.get("aligned_tflops")
    if not odd_ms or not odd_rate:
        return []
    if not even_rate:
        raise NotApplicable("no aligned matmul as big to compare the unaligned ones with")
    busy = float(dev.get("gpu_busy_ms") or 0.0)
    share = odd_ms / busy if busy > 0 else 0.0
    ratio = odd_rate / even_rate
    if share < UNALIGNED_SHARE_MIN or ratio > UNALIGNED_RATE_MAX:
        return []
    rows = g.get("unaligned") or []
    top = rows[0] if rows else {}
    saved = odd_ms * (1.0 - ratio)
    title = (f"matmuls with a dimension off the 16-byte alignment run at {odd_rate:g} TFLOP/s, "
             f"the aligned ones at {even_rate:g}: {odd_ms:.3g} ms per step ({_pct(share)} of GPU time)"
             + (f", {top['shape']} at {top['site']}" if top.get("site") else ""))
    evidence = {
        "unaligned_ms_per_step": odd_ms,
        "unaligned_share_of_gpu_time": round(share, 4),
        "unaligned_tflops": odd_rate,
        "aligned_tflops": even_rate,
        "aligned_ms_per_step": g.get("aligned_ms"),
        "gain_if_as_fast_ms_per_step": round(saved, 3),
        "matmuls": [_site_line(r, f"{r['op']} {r['shape']} {r['dtype']}, {r['calls']:g}/step, "
                                  f"{r['device_ms']:g} ms/step, {r['tflops']:g} TFLOP/s") for r in rows[:4]],
        "compared": f"matmuls of at least {float(g.get('min_flop') or 0):.0e} FLOP each",
    }
    return [finding(
        "gemm-unaligned", title, evidence,
        fix="Pad the odd dimension up to a multiple of 64: a vocabulary of 50257 to 50304 (the "
            "extra output rows are never a target; llm.c's C trainer and nanoGPT do this), a hidden "
            "or head size to the next multiple of 64; make batch × sequence a multiple of 8. Then "
            "re-run `torchdoctor profile` to see the matmuls at the aligned rate.")]
