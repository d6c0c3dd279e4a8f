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
from torchdoctor.rules.perf_step import OTHER_LOAD_CORES
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


@rule("rank-straggler", probes={"ranks"}, needs={"step", "dist_step", "step_device", "cpu"},
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
    if lt["basis"] == "host":
        starved = _starved(ev.events, r, lags[r])
        if starved:
            raise NotApplicable(starved)
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


def _cpu_per_step(events: list[dict[str, Any]]) -> dict[int, tuple[float, float, float]]:
    """Per rank, from its ``cpu`` event: (s on a CPU per step, s runnable but waiting for a CPU per
    step, the neighbours' load in cores) over the instrument's window of steps."""
    out = {}
    for e in events:
        if e.get("kind") != "cpu" or "rank" not in e or e.get("threads_runqueue_wait_s") is None:
            continue
        win = e.get("window_steps") or []
        if len(win) != 2 or e.get("threads_on_cpu_s") is None:
            continue
        n = max(1, int(win[1]) - int(win[0]) + 1)
        out[int(e["rank"])] = (float(e["threads_on_cpu_s"]) / n, float(e["threads_runqueue_wait_s"]) / n,
                               float(e.get("other_load_cores") or 0.0))
    return out


def _starved(events: list[dict[str, Any]], r: int, lag: float) -> str | None:
    """Why rank r's lag is the host's, not the job's, or None. Its threads waited for a CPU (run
    queue, /proc schedstat) at least OWN_SHARE of the lag more per step than the others', other
    processes loaded the host (OTHER_LOAD_CORES), and its own extra CPU work, stretched by the
    others' share of waiting, explains less than OWN_SHARE of the lag. Extra work of its own (a
    genuine straggler) is on-CPU time; a rank that sleeps or waits on I/O is not waiting for a CPU.
    Seen on a 2-core box at load 18-23 (issue 27 re-run, Lightning DDP, gloo): rank 1 33 ms late in
    its data phase in 92% of steps in one run of two, both ranks doing the same work."""
    cpu = _cpu_per_step(events)
    if r not in cpu or len(cpu) < 2:
        return None
    run_r, wait_r, other_load = cpu[r]
    others = [v for q, v in cpu.items() if q != r]
    run_o = statistics.median(v[0] for v in others)
    wait_o = statistics.median(v[1] for v in others)
    share_o = wait_o / (run_o + wait_o) if run_o + wait_o > 0 else 0.0
    from_work = max(0.0, run_r - run_o) / max(1e-6, 1.0 - share_o)
    extra_wait = wait_r - wait_o
    if other_load < OTHER_LOAD_CORES or extra_wait < OWN_SHARE * lag or from_work >= OWN_SHARE * lag:
        return None
    return (f"rank {r} arrives {lag * 1e3:.3g} ms late, but its threads waited for a CPU "
            f"{extra_wait * 1e3:.3g} ms more per step than the others' while other processes used "
            f"{other_load:.1f} cores: the host is loaded, not the job (run on an idle machine to judge)")
