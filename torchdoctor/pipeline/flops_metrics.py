"""The yardstick (``report.metrics['flops']``): achieved FLOP/s per step and, on a GPU with a known
peak for the dtype in use, model FLOPs utilisation (MFU).

Pure: Evidence in, a dict out (None when the run did not arm the FLOP counter). The numerator is
one counted step (``instruments/perf/flop_count.py``); the denominator the median wall time of the
plain steps: the judged steps (warm-up left out) without the counted step and, in a ``profile``
run, without the steps the profiler window touched. Keys (docs/json.md):

    status            "ok" | "skipped" | "not-reached" | "atypical"
    reason            why there is no figure (status not "ok"), or why no MFU (``mfu_reason``)
    counted_step      the step whose FLOPs were counted
    source            how the FLOPs were obtained (the counter and the step, or a borrowed count)
    flops_per_step    FLOPs of that step (matmuls, convolutions, attention; forward + backward)
    flops_by_dtype    the same per dtype class (fp32 / tf32 / bf16 / fp16 / fp8)
    top_ops           the ops that did them (FLOPs)
    step_ms           the median plain step time, and ``steps_timed`` how many steps it is over;
                      on CUDA each step's time is the longer of its host wall time and its device
                      span (CUDA events between step ends): the host runs ahead of the GPU, so its
                      time alone undercounts a GPU-bound step (``step_time_basis`` says which)
    achieved_flops_per_s   flops_per_step / step time
    dtype             the dtype class with most FLOPs
    device, device_name    where they ran ("cuda" / "cpu"; the GPU's name)
    peak_flops_per_s  the card's one fixed yardstick: its dense bf16 (else fp16) tensor-core peak
                      (``perf/peaks.py``), the same whatever precision the run uses
    peak_dtype        which row that is ("bf16", "fp16")
    peak_source       the table's line and its data sheet
    mfu               achieved / peak_flops_per_s (0..1); absent on CPU and unknown GPUs, with
                      ``mfu_reason``; ``mfu_suspect`` (why) when above 75%
    dtype_peak_flops_per_s, mfu_dtype_peak   the dense peak of the step's dtype mix, and achieved
                      over it: how close the math runs to what its precision allows
    counter_cost      the counted step's wall time over the median plain step (what counting cost)
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.registry import metrics_provider
from torchdoctor.evidence.steps import counted_steps, judged_steps, step_seconds

COUNTER = "torch.utils.flop_counter.FlopCounterMode"


def plain_steps(ev: Evidence) -> list[dict[str, Any]]:
    """Judged steps (no warm-up, no counted step) the profiler window did not touch either."""
    steps = judged_steps(ev)
    w = ev.last("profile_window")
    if w and w.get("status") in ("ok", "partial"):
        from torchdoctor.evidence.profile import touched_steps

        touched = touched_steps(w)
        steps = [s for s in steps if s.get("step") not in touched] or steps
    return steps


def _typical(ev: Evidence, step: int, plain: list[dict[str, Any]]) -> str | None:
    """Why the counted step is not a typical step (more batches or backward calls), or None."""
    counted = next((s for s in ev.of("step") if s.get("step") == step), None)
    if counted is None or not plain:
        return None
    for key, what in (("batches", "batches"), ("backwards", "backward calls")):
        usual = statistics.median(int(s.get(key, 0)) for s in plain)
        if int(counted.get(key, 0)) != usual:
            return (f"the counted step {step} had {counted.get(key, 0)} {what}, a plain step "
                    f"{usual:g}: its FLOPs are not one step's")
    return None


def flops_metrics_with(ev: Evidence, counted: dict[str, Any], source: str | None = None
                       ) -> dict[str, Any]:
    """The metrics of run ``ev`` with the FLOP count ``counted`` (a ``flops`` event: this run's,
    or a baseline's for a treated run where the counter could not run; then say so in ``source``)."""
    from torchdoctor.perf.flops import mfu

    step = counted.get("counted_step")
    out: dict[str, Any] = {"status": counted.get("status"), "counted_step": step}
    if counted.get("status") != "ok":
        out["reason"] = counted.get("reason")
        return out
    out["source"] = source or f"{COUNTER}, step {step} of this run"
    plain = plain_steps(ev)
    atypical = _typical(ev, int(step), plain) if source is None else None
    if atypical:
        out.update(status="atypical", reason=atypical)
        return out
    if not plain:
        out.update(status="skipped", reason="no plain step was timed")
        return out
    walls, basis = step_seconds(ev, plain)
    step_s = statistics.median(walls)
    by_dtype = {k: int(v) for k, v in (counted.get("flops_by_dtype") or {}).items() if v}
    total = int(counted.get("flops") or 0)
    out.update(flops_per_step=total, flops_by_dtype=by_dtype, top_ops=counted.get("by_op") or {},
               step_ms=round(step_s * 1e3, 4), steps_timed=len(walls),
               step_time_basis=basis,
               device=counted.get("device"), device_name=counted.get("device_name"))
    if counted.get("other_device_flops"):
        out["other_device_flops"] = counted["other_device_flops"]
    if counted.get("errors"):
        out["counter_errors"] = counted["errors"]
    if total <= 0:
        out.update(status="skipped", reason="the counter saw no matmul, convolution or attention "
                   "in the step")
        return out
    m = mfu(by_dtype, step_s, str(counted.get("device")), counted.get("device_name"))
    out["achieved_flops_per_s"] = round(m["achieved_flops_per_s"], 1)
    out["dtype"] = m["dtype"]
    for k in ("peak_flops_per_s", "peak_dtype", "peak_source", "mfu_reason", "mfu_suspect",
              "dtype_peak_flops_per_s"):
        if m.get(k) is not None:
            out[k] = m[k]
    for k in ("mfu", "mfu_dtype_peak"):
        if m.get(k) is not None:
            out[k] = round(m[k], 4)
    if source is None:
        wall = next((float(s["wall_s"]) for s in ev.of("step") if s.get("step") == step), None)
        if wall is not None and step_s > 0:
            out["counter_cost"] = round(wall / step_s, 3)
    return out


@metrics_provider("flops", needs={"flops", "step"})
def flops_metrics(ev: Evidence) -> dict[str, Any] | None:
    f = ev.last("flops")
    if f is None:
        return None
    return flops_metrics_with(ev, f)


__all__ = ["flops_metrics", "flops_metrics_with", "plain_steps", "counted_steps"]
