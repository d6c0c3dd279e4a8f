"""Pure per-rank step analysis of a ranked run: step times and arrival lags (no I/O).

Arrival of rank r at step s: the start of its first ``backward`` in that step (``dist_step``
``bwd_at``, host-wide monotonic clock). Its lag: arrival minus the median arrival of the
other ranks. Synchronous data parallelism makes everyone wait for the last arrival.

A rank can be last without doing more work: the ranks leave a collective at slightly
different times (gloo's ring finishes on one rank later: ≈ 2 ms on a loaded 2-core box), and
whoever leaves last arrives last at the next step. So the lag is blamed on a rank only when
its own work also is longer: ``own`` = step wall time − backward − time inside recorded
collectives, i.e. the work between two synchronisations (data, forward, optimizer, other),
and the straggler's ``own`` exceeds the others' by a good part of its lag. The first step
(warm-up: lazy init, DDP's first bucket rebuild) is left out.

On CUDA the host clocks are paced by the device, so the device's own time is used instead
(:func:`device_table`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from torchdoctor.evidence import spans_of

PHASES = ("data", "forward", "backward", "optimizer", "other")
WARMUP_STEPS = 1


def per_rank_steps(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("kind") == "step" and "rank" in e:
            out[int(e["rank"])].append(e)
    return dict(out)


def arrivals(events: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """{step: {rank: bwd_at}} for the steps where a backward started."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for e in events:
        if e.get("kind") == "dist_step" and e.get("bwd_at") is not None:
            out[int(e["step"])][int(e["rank"])] = float(e["bwd_at"])
    return dict(out)


def own_work(events: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """{step: {rank: seconds of work outside backward and outside recorded collectives}}."""
    coll = {(int(e["rank"]), int(e["step"])): float(e.get("coll_s") or 0.0)
            for e in events if e.get("kind") == "dist_step"}
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for e in events:
        if e.get("kind") == "step" and "rank" in e:
            r, s = int(e["rank"]), int(e["step"])
            own = float(e["wall_s"]) - float(e.get("backward_s", 0.0)) - coll.get((r, s), 0.0)
            out[s][r] = max(0.0, own)
    return dict(out)


def lag_table(events: list[dict[str, Any]], world: int, only: Any = None) -> dict[str, Any] | None:
    """Per rank: median lag (s), share of judged steps it arrived last, median excess of its own
    work over the others' (s); None if unjudgeable. ``only``: the steps to judge (default all)."""
    arr = arrivals(events)
    own = own_work(events)
    steps = sorted(s for s, by in arr.items() if len(by) == world and s > WARMUP_STEPS
                   and (only is None or s in only))
    if world < 2 or not steps:
        return None
    lags: dict[int, list[float]] = defaultdict(list)
    excess: dict[int, list[float]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    for s in steps:
        by = arr[s]
        for r, t in by.items():
            others = [u for q, u in by.items() if q != r]
            lags[r].append(t - statistics.median(others))
            mine, rest = own.get(s, {}), [v for q, v in own.get(s, {}).items() if q != r]
            if r in mine and rest:
                excess[r].append(mine[r] - statistics.median(rest))
        last[max(by, key=by.get)] += 1
    return {"steps": len(steps), "judged": steps, "basis": "host",
            "median_lag_s": {r: statistics.median(v) for r, v in sorted(lags.items())},
            "last_share": {r: last[r] / len(steps) for r in sorted(lags)},
            "own_excess_s": {r: statistics.median(v) for r, v in sorted(excess.items())}}


def device_table(events: list[dict[str, Any]], world: int, only: Any = None) -> dict[str, Any] | None:
    """On CUDA: per rank, median excess of device time outside backward (s) and the share of
    steps it had the most; None without CUDA-event step times on every rank.

    Host times mislead on an asynchronous device: a rank whose host races ahead blocks later,
    in whatever call synchronises (a pageable copy, ``.item()``), and that wait looks like its
    own work. On the device, under DDP, the wait for the others is inside backward (the
    compute stream waits for the gradient all-reduce before backward's end event), so a
    step's device span minus its device backward is the rank's own device work, idle gaps
    included: a rank whose host is late leaves its GPU idle longer.
    """
    own: dict[int, dict[int, float]] = defaultdict(dict)
    spans: list[float] = []
    for e in events:
        if e.get("kind") == "step_device" and "rank" in e and e.get("span_ms") is not None:
            s = int(e["step"])
            if s > WARMUP_STEPS and (only is None or s in only):
                own[s][int(e["rank"])] = (float(e["span_ms"]) - float(e.get("backward_ms") or 0.0)) / 1e3
                spans.append(float(e["span_ms"]) / 1e3)
    steps = sorted(s for s, by in own.items() if len(by) == world)
    if world < 2 or not steps:
        return None
    excess: dict[int, list[float]] = defaultdict(list)
    most: dict[int, int] = defaultdict(int)
    for s in steps:
        by = own[s]
        for r, v in by.items():
            excess[r].append(v - statistics.median([u for q, u in by.items() if q != r]))
        most[max(by, key=by.get)] += 1
    med = {r: statistics.median(v) for r, v in sorted(excess.items())}
    return {"steps": len(steps), "judged": steps, "basis": "device", "median_lag_s": med,
            "last_share": {r: most[r] / len(steps) for r in sorted(excess)},
            "own_excess_s": med, "median_span_s": statistics.median(spans)}


def collective_s(events: list[dict[str, Any]]) -> dict[int, float]:
    """Per rank: median host seconds a step spent inside the script's own recorded collectives
    (outside DDP's backward all-reduce, which the reducer issues unrecorded)."""
    by: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("kind") == "dist_step" and int(e.get("step") or 0) > WARMUP_STEPS:
            by[int(e["rank"])].append(float(e.get("coll_s") or 0.0))
    return {r: statistics.median(v) for r, v in by.items() if v}


def rank_spans(events: list[dict[str, Any]]) -> dict[int, dict[int, float]]:
    """{rank: {step: seconds}}: each rank's device span between step ends (CUDA runs)."""
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("kind") == "step_device" and "rank" in e:
            rows[int(e["rank"])].append(e)
    return {r: spans for r, got in rows.items() if (spans := spans_of(got))}


def step_medians(steps: list[dict[str, Any]], spans: dict[int, float] | None = None
                 ) -> dict[str, Any] | None:
    """A rank's step medians. ``spans`` ({step: s}, CUDA): the one step-time basis of every
    command (``evidence.step_seconds``): a step's time is its device span where one was read."""
    judged = steps[WARMUP_STEPS:] if len(steps) > WARMUP_STEPS + 1 else steps
    if not judged:
        return None
    sp = spans or {}
    out = {"steps": len(steps),
           "median_step_s": statistics.median(sp.get(int(s.get("step") or 0), float(s["wall_s"]))
                                              for s in judged)}
    for p in PHASES:
        out[f"{p}_s"] = statistics.median(float(s.get(f"{p}_s", 0.0)) for s in judged)
    return out


def rank_summary(events: list[dict[str, Any]], world: int,
                 ranks: list[int] | None = None) -> dict[str, Any] | None:
    """metrics['ranks']: per-rank step medians (ms) and arrival lags; None without steps.
    ``ranks``: the rank labels (default 0..world-1; one node of a multi-node job has others)."""
    steps = per_rank_steps(events)
    if not steps:
        return None
    spans = rank_spans(events)
    lags = device_table(events, world) or lag_table(events, world)
    rows = []
    for r in (ranks if ranks is not None else range(world)):
        m = step_medians(steps.get(r, []), spans.get(r))
        row: dict[str, Any] = {"rank": r, "steps": len(steps.get(r, []))}
        if m:
            row["median_step_ms"] = round(m["median_step_s"] * 1e3, 3)
            row["phase_ms"] = {p: round(m[f"{p}_s"] * 1e3, 3) for p in PHASES}
        if lags and r in lags["median_lag_s"]:
            row["median_lag_ms"] = round(lags["median_lag_s"][r] * 1e3, 3)
            row["last_share"] = round(lags["last_share"][r], 3)
            if r in lags["own_excess_s"]:
                row["own_excess_ms"] = round(lags["own_excess_s"][r] * 1e3, 3)
        rows.append(row)
    return {"world_size": world, "judged_steps": lags["steps"] if lags else 0,
            "lag_basis": lags["basis"] if lags else None, "per_rank": rows}
