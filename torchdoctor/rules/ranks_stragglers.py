"""The straggler rule of a ranked run (probe ``"ranks"``): rank-straggler, one rank whose own work
makes the others wait every step, from the per-rank step arrivals at backward (host clock) or
the device time outside backward (CUDA events).
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.distributed.stragglers import (PHASES, collective_s, device_table, lag_table,
                                                per_rank_steps, rank_spans, step_medians)
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.ranks import world_of
from torchdoctor.skills import DISTRIBUTED

# rank-straggler: last to arrive in at least LAST_SHARE of the judged steps, by a median lag
# of at least LAG_FRACTION of the median step time and at least LAG_MIN_S, over MIN_STEPS+,
# and its own work (outside backward and collectives) longer than the others' by at least
# OWN_SHARE of that lag (else it is only late from leaving the last collective late); all of it
# in each of PERSIST_PARTS consecutive parts of the run (a lag that persists, not one episode).
# LAG_MIN_S: healthy DDP showed 2.1-2.5 ms of jitter (gloo, 12 ms steps; NCCL on 2xH200, 3.7 ms
# steps, device time outside backward): a lag must matter in absolute terms, well above that.
LAST_SHARE = 0.75
LAG_FRACTION = 0.10
LAG_MIN_S = 0.010
OWN_SHARE = 0.5
MIN_STEPS = 8
PERSIST_PARTS = 2
RANK_STRAGGLER = declare("rank-straggler", DISTRIBUTED, "warning",
                         "one rank's step time is consistently slower",
                         thresholds={"LAST_SHARE": LAST_SHARE, "LAG_FRACTION": LAG_FRACTION,
                                     "LAG_MIN_S": LAG_MIN_S, "OWN_SHARE": OWN_SHARE,
                                     "MIN_STEPS": MIN_STEPS, "PERSIST_PARTS": PERSIST_PARTS})


@rule("rank-straggler", probes={"ranks"}, needs={"step", "dist_step", "step_device"},
      raises=[RANK_STRAGGLER])
def rank_straggler(ev: Evidence) -> list[Finding]:
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank")
    lt = device_table(ev.events, world) or lag_table(ev.events, world)
    if lt is None or lt["steps"] < MIN_STEPS:
        raise NotApplicable(f"needs {MIN_STEPS}+ steps with a backward on every rank "
                            f"(after the first)")
    lags, shares = lt["median_lag_s"], lt["last_share"]
    r = max(lags, key=lags.get)
    steps = per_rank_steps(ev.events)
    spans = rank_spans(ev.events)
    meds = {q: step_medians(v, spans.get(q)) for q, v in steps.items()}
    step_s = statistics.median([m["median_step_s"] for m in meds.values() if m]) if meds else 0.0
    if lt["basis"] == "device":
        step_s = lt["median_span_s"]
    need = max(LAG_FRACTION * step_s, LAG_MIN_S)
    excess = lt["own_excess_s"].get(r, 0.0)
    if not _late(lt, r, need):
        return []
    table = device_table if lt["basis"] == "device" else lag_table
    judged = lt["judged"]
    for i in range(PERSIST_PARTS):  # the lag persists: the same verdict in each part of the run
        part = set(judged[i * len(judged) // PERSIST_PARTS:(i + 1) * len(judged) // PERSIST_PARTS])
        pt = table(ev.events, world, only=part)
        if pt is None or not _late(pt, r, need):
            return []
    waited = collective_s(ev.events).get(r, 0.0)
    if lt["basis"] == "device" and waited > 0:
        # its device time outside backward may be waiting inside its own collectives (NCCL kernels
        # wait for the slowest rank): blamed only when its host's own work (outside backward and
        # collectives) is longer too
        host = lag_table(ev.events, world)
        if host is None or host["own_excess_s"].get(r, 0.0) < OWN_SHARE * lags[r]:
            return []
    evidence: dict[str, Any] = {
        "rank": r, "basis": "CUDA events: device time outside backward" if lt["basis"] == "device"
        else "host clock: arrival at backward, work outside backward and collectives",
        "median_lag_ms": round(lags[r] * 1e3, 2),
        "last_to_arrive": f"{shares[r]:.0%} of {lt['steps']} steps",
        "median_step_ms": round(step_s * 1e3, 2),
        "others_wait": f"{lags[r] / step_s:.0%} of each step" if step_s else None,
        "own_work_excess_ms": round(excess * 1e3, 2),
        "persists": f"in each of {PERSIST_PARTS} parts of the run (steps {lt['judged'][0]}-{lt['judged'][-1]})",
    }
    where_txt = ""
    if meds.get(r) and lt["basis"] == "host":
        diffs = {}
        for p in PHASES:
            if p == "backward":
                continue  # the others' wait for the straggler lands in their backward (DDP)
            others = [meds[q][f"{p}_s"] for q in meds if q != r and meds[q]]
            if others:
                diffs[p] = meds[r][f"{p}_s"] - statistics.median(others)
        if diffs:
            p = max(diffs, key=diffs.get)
            if diffs[p] > 0.5 * lags[r]:
                evidence["slower_phase"] = f"{p}: +{diffs[p] * 1e3:.3g} ms per step on rank {r}"
                label = {"data": "data loading", "forward": "forward", "optimizer": "optimizer step",
                         "other": "other code of the loop (outside data loading, forward, backward "
                                  "and the optimizer)"}[p]
                where_txt = f"; it spends {diffs[p] * 1e3:.3g} ms more per step in {label}"
    if lt["basis"] == "device":
        title = (f"rank {r} is a straggler: its GPU spends {lags[r] * 1e3:.3g} ms more per step "
                 f"outside backward than the others' (median; the most in {shares[r]:.0%} of "
                 f"steps), and the other GPUs wait that long in the gradient all-reduce")
    else:
        title = (f"rank {r} is a straggler: it reaches backward {lags[r] * 1e3:.3g} ms after the "
                 f"others (median) in {shares[r]:.0%} of steps and every other rank waits for it"
                 f"{where_txt}")
    return [finding(
        "rank-straggler", title,
        evidence,
        fix="Look at what that rank does differently before backward: uneven or slower data "
            "(shard sizes, storage, fewer DataLoader workers), work only that rank does "
            "(rank-0 logging, evaluation or checkpointing inside the loop: move it off the step "
            "or overlap it), or a slower/busier device (torchdoctor env)")]


def _late(lt: dict, r: int, need: float) -> bool:
    """Rank r is last often enough, late enough, and by its own work (not a late exit)."""
    lag = lt["median_lag_s"].get(r, 0.0)
    return (lt["steps"] >= 2 and lt["last_share"].get(r, 0.0) >= LAST_SHARE and lag >= need
            and lt["own_excess_s"].get(r, 0.0) >= OWN_SHARE * lag)
