"""collectives-exposed: a rank's GPU spends a large share of the step only communicating
(probe ``profile`` on a ranked run; judged per rank, merged across ranks like every per-rank rule).

Input: the profiler window's collectives table (``profile_collectives``,
``instruments/profile/_profile_comms.py``) and the un-profiled step time (``rules/profile.bare_clock``).
Judged on the device basis only (NCCL kernels on the GPU timeline): on gloo (CPU) the collective
runs on a worker thread that shares the cores with the training thread, so "overlap" there is
not what prefetching buys on a GPU, and the rule says it is not applicable.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import DISTRIBUTED

EXPOSED_SHARE = 0.15  # exposed collective time per step, as a share of the un-profiled step ...
EXPOSED_MIN_MS = 0.5  # ... and at least this many ms per step
GPU_BUSY_MIN = 0.5  # judged only when the GPU computes (collectives' exposed time left out) this share of
# the step: on a host-bound step an NCCL kernel's time is mostly waiting for the other rank's host
COLLECTIVES_EXPOSED = declare(
    "collectives-exposed", DISTRIBUTED, "warning",
    "collectives run on the critical path: the GPU waits for communication",
    thresholds={"EXPOSED_SHARE": EXPOSED_SHARE, "EXPOSED_MIN_MS": EXPOSED_MIN_MS,
                "GPU_BUSY_MIN": GPU_BUSY_MIN})

FIXES = {
    "all_gather": (
        "FSDP2's all-gathers are exposed: prefetch the next unit's parameters "
        "(`block.set_modules_to_forward_prefetch([next_block])`, `set_modules_to_backward_prefetch`), "
        "keep the units that backward needs first unsharded after forward (`reshard_after_forward=False` "
        "on the root or the last blocks, or an int to re-gather within a node), and shard fewer, larger "
        "units (`fully_shard` on groups of blocks) so each all-gather is big enough to run near bus "
        "bandwidth."),
    "reduce_scatter": (
        "FSDP2's reduce-scatters are exposed: prefetch in backward (`set_modules_to_backward_prefetch`), "
        "shard fewer, larger units, and with gradient accumulation skip the reduction on all but the "
        "last micro-batch (`model.set_requires_gradient_sync(False)`)."),
    "all_reduce": (
        "All-reduces are exposed: under DDP tune `bucket_cap_mb` (smaller buckets start earlier in "
        "backward, larger ones run nearer bus bandwidth) and use `no_sync()` on all but the last "
        "micro-batch of an accumulation; an all-reduce written by hand each step (loss or metric "
        "averaging) blocks: reduce less often or with `async_op=True` and wait later."),
    "all_reduce_tp": (
        "The exposed all-reduces are DTensor's (tensor parallelism: the reduction after each row-wise "
        "layer is on the critical path by design): keep the tensor-parallel group within NVLink (one "
        "node), use sequence parallelism (`SequenceParallel`: a reduce-scatter and an all-gather that "
        "overlap better), or a smaller TP degree with more FSDP."),
    "all_to_all": (
        "All-to-alls are exposed (expert or sequence parallelism): overlap the dispatch with compute "
        "(split the batch and pipeline chunks) or send fewer, larger messages."),
    "broadcast": (
        "Broadcasts are exposed: broadcast once before the loop, not every step."),
}


def _fix_key(kind: str, row: dict[str, Any]) -> str:
    """The fix text of a kind: DTensor's all-reduces (functional collectives) are tensor parallelism's."""
    ops = row.get("ops") or []
    if kind == "all_reduce" and ops and all(str(o).startswith("_c10d_functional::") for o in ops):
        return "all_reduce_tp"
    return kind


def judged_table(ev: Evidence) -> tuple[dict[str, Any], float]:
    """(the rank's collectives table, its un-profiled step ms); NotApplicable when not judged."""
    from torchdoctor.evidence.commranks import unprofiled_step_ms

    t = ev.last("profile_collectives")
    if not t:
        raise NotApplicable("no collective in the profiled steps")
    if (ev.last("profile_window") or {}).get("status") != "ok":
        raise NotApplicable("the profile window did not record a whole training step")
    if t.get("basis") != "device":
        raise NotApplicable("gloo on CPU: collectives run on worker threads that share the cores "
                            "with the training thread; exposure is shown, not judged")
    step_ms = unprofiled_step_ms(ev)
    if not step_ms:
        raise NotApplicable("no un-profiled step time")
    exposed = float((t.get("total") or {}).get("exposed_ms") or 0.0)
    if exposed > step_ms:
        # measured on 2xH200 (a small FSDP2 LM, session 9): 46.5 ms exposed against a 22.7 ms step.
        # An NCCL kernel that waits for a peer's launch is GPU time; the profiled steps' waits grew
        # with the tracer's cost on the peer's host: not a figure of the un-profiled step
        raise NotApplicable(f"the collectives' exposed time ({exposed:.3g} ms per profiled step) exceeds "
                            f"the un-profiled step ({step_ms:.3g} ms): they waited for the profiled hosts")
    # the GPU's own work: an NCCL kernel waiting for another rank keeps the GPU "busy" too
    compute = (float((ev.last("profile_device") or {}).get("gpu_busy_ms") or 0.0) - exposed) / step_ms
    if compute < GPU_BUSY_MIN:
        raise NotApplicable(f"the GPU computes {max(compute, 0.0):.0%} of the step (collectives left out): "
                            f"host-bound, and an NCCL kernel's time then is mostly waiting for the other "
                            f"ranks' hosts (see launch-bound)")
    return t, step_ms


@rule("collectives-exposed", probes={"profile"},
      needs={"profile_collectives", "profile_window", "profile_device", "step"},
      raises=[COLLECTIVES_EXPOSED])
def collectives_exposed(ev: Evidence) -> list[Finding]:
    if not ev.last("profile_collectives") and not (ev.meta.get("options") or {}).get("nproc_per_node"):
        return []  # one process (not launched on ranks): no collective, none exposed
    t, step_ms = judged_table(ev)
    exposed = float((t.get("total") or {}).get("exposed_ms") or 0.0)
    share = exposed / step_ms
    if share < EXPOSED_SHARE or exposed < EXPOSED_MIN_MS:
        return []
    kinds = t.get("kinds") or {}
    ranked = sorted(kinds.items(), key=lambda kv: -float(kv[1].get("exposed_ms") or 0.0))
    top = ranked[0][0] if ranked else "other"
    rows = {k: {key: v[key] for key in ("calls_per_step", "ms", "exposed_ms", "overlapped_ms",
                                         "bytes_per_step", "busbw_gbs", "ops") if key in v}
            for k, v in ranked}
    title = (f"collectives leave the GPU idle {exposed:.3g} ms per step ({share:.0%} of a {step_ms:.3g} ms "
             f"step), most in {top.replace('_', '-')}")
    evidence = {"exposed_ms_per_step": round(exposed, 4), "exposed_share": round(share, 4),
                "step_ms": step_ms, "collective_ms_per_step": (t.get("total") or {}).get("ms"),
                "steps_recorded": t.get("steps"), "by_kind": rows}
    fix = " ".join(FIXES[_fix_key(k, v)] for k, v in ranked[:2]
                   if k in FIXES and float(v.get("exposed_ms") or 0.0) >= EXPOSED_MIN_MS) or FIXES.get(
        _fix_key(top, kinds.get(top) or {}), "Overlap the collectives with compute, or issue fewer, larger ones.")
    return [finding("collectives-exposed", title, evidence, fix=fix)]
