"""A trial's numbers: the one place where a run's metrics are assembled, and the trial entry.

:func:`run_metrics` is **the** place a run contributes numbers to a trial: every key it returns
appears, as the median over the rounds, in each trial's ``before`` (baseline) and ``after``
(treated) objects, in the JSON and in the console table. To add a metric (FLOP/s, MFU, …) add
one line there — and, when it reads evidence that a plain ``checkup`` run does not record, its
evidence kind to :data:`RUN_NEEDS` (every treat run arms it, baseline and treated alike).

:func:`trial_entry` turns the baseline rounds and one trial's rounds into the ``trials[]``
entry (docs/contract.md, docs/treat.md): step times, spread, speed-up, peak memory, the loss
check, the verdict, the fix and where.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from torchdoctor.treat.catalogue import BY_NAME
from torchdoctor.trials.compare import MIN_NOISE, median, spread, speedup
from torchdoctor.treat.verdict import band_of, loss_check, verdict

# evidence kinds every treat run arms beyond the checkup instruments (see the module docstring)
# ("flops": one step of every run counted by the yardstick's FLOP counter, left out of the
# step times; gives the achieved FLOP/s and, on a GPU of the peak table, the MFU before/after)
RUN_NEEDS = frozenset({"treatment", "treat_survey", "flops"})


def compile_steps(run: Any) -> set[int]:
    """Steps left out of a compile trial's step time: those in which torch.compile compiled and
    every step before the first compiled one (eager)."""
    steps = [int(s) for _, ev in _evidences(run)  # a ranked run: any rank's compile steps
             for s in (ev.last("treatment") or {}).get("compile_steps") or []]
    if not steps:
        return set()
    return set(range(1, min(steps))) | set(steps)


def run_metrics(run: Any) -> dict[str, Any]:
    """The numbers of one run that a trial compares (medians over the judged steps)."""
    from torchdoctor.pipeline.flops_metrics import flops_metrics

    peak, kind = run.peak_memory()
    f = flops_metrics(run.evidence) or {}
    return {
        "step_ms": run.median_ms(exclude=compile_steps(run)),
        "peak_memory": peak,
        "peak_reserved": run.peak_reserved(),
        "flops_per_s": f.get("achieved_flops_per_s"),
        "mfu": f.get("mfu"),
    }


def _rounds_median(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in rows[0] if rows else {}:
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float))]
        if vals:
            m = statistics.median(vals)
            out[k] = round(m, 4) if isinstance(m, float) else m
    return out


def _evidences(run: Any) -> list[tuple[str, Any]]:
    """(label, Evidence) of a run: one, or each rank's of a ranked run ("rank R: ")."""
    per = getattr(run, "rank_evidence", None)
    return [(f"rank {r}: ", ev) for r, ev in per()] if per else [("", run.evidence)]


def failure_of(runs: Sequence[Any]) -> str | None:
    for r in runs:
        for label, ev in _evidences(r):
            errs = ev.of("treatment_error")
            if errs:
                return f"{label}the treatment raised: {errs[0].get('error')}"
            inst = [e for e in ev.of("instrument_error") if e.get("instrument") == "treatment"]
            if inst:
                return f"{label}the treatment failed in {inst[0].get('callback')}"
        f = r.failure()
        if f:
            return f
    return None


def _loss_check(base: Sequence[Any], treated: Sequence[Any], tolerance: float) -> dict[str, Any]:
    """The numerics guard over one process's losses, or rank by rank on ranked runs (each rank
    trains on its own shard: compared with the same rank of the baseline); the worst rank's."""
    ranked = [getattr(r, "rank_losses", None) for r in [*base, *treated]]
    if not ranked or not all(ranked):
        return loss_check([r.losses() for r in base], [r.losses() for r in treated], tolerance)
    b = [r.rank_losses() for r in base]
    t = [r.rank_losses() for r in treated]
    ranks = sorted({k for x in [*b, *t] for k in x})
    checks = {k: loss_check([x.get(k) or [] for x in b], [x.get(k) or [] for x in t], tolerance)
              for k in ranks}
    if not checks:
        return loss_check([], [], tolerance)

    def badness(item):
        k, c = item
        return (c["ok"] is False, c["ok"] is not None, c["max_rel_diff"] or 0.0, -k)

    k, worst = max(checks.items(), key=badness)
    worst = dict(worst)
    if worst["ok"] is not None or len(checks) > 1:
        worst["note"] = (f"loss checked on each of {len(checks)} ranks, worst: rank {k}" +
                         ("; " + worst["note"] if worst["note"] else ""))
    worst["steps"] = min(c["steps"] for c in checks.values())
    return worst


def _losses_comparable(name: str, survey: dict[str, Any]) -> str | None:
    """Why a trial's loss cannot be compared step by step (None: it can)."""
    if name == "dataloader-workers" and survey.get("rng_in_fetch"):
        return ("the dataset draws random numbers while a batch is fetched; in worker processes "
                "they come from per-worker seeds, so the batches differ: the loss was checked "
                "for non-finite values only")
    return None


def trial_entry(name: str, setting: str, base: Sequence[Any], treated: Sequence[Any], *,
                tolerance: float, intent: str, survey: dict[str, Any] | None = None,
                baseline_oom: bool = False) -> dict[str, Any]:
    """The ``trials[]`` entry of one trial from the baseline runs and the trial's runs."""
    from torchdoctor.treat.fixes import fix_of

    ok_base = [r for r in base if r.failure() is None]
    b_rows = [run_metrics(r) for r in ok_base]
    t_rows = [run_metrics(r) for r in treated if r.failure() is None]
    b_med = [m["step_ms"] for m in b_rows if m.get("step_ms") is not None]
    t_med = [m["step_ms"] for m in t_rows if m.get("step_ms") is not None]
    before, after = _rounds_median(b_rows), _rounds_median(t_rows)
    failure = failure_of(treated)
    memory_key = "peak_reserved" if intent == "memory" and before.get("peak_reserved") else "peak_memory"
    kind = (treated or base)[0].peak_memory()[1] if (treated or base) else None
    if memory_key == "peak_reserved":
        kind = "cuda-reserved"
    note = _losses_comparable(name, survey or {})
    lc = _loss_check(ok_base, [r for r in treated if r.failure() is None],
                     float("inf") if note else tolerance)
    if note:
        lc["note"] = (note + ("; " + lc["note"] if lc["note"] else ""))
        if lc["ok"] is not False:
            lc["ok"] = None
    sp = speedup(b_med, t_med)
    band = band_of(spread(b_med), spread(t_med), len(b_med), len(t_med), MIN_NOISE)
    v, reason = verdict(intent=intent, speedup=sp, band=band, loss_ok=lc["ok"],
                        loss_note=lc["note"], max_rel_diff=lc["max_rel_diff"], allowed=lc["allowed"],
                        peak_before=before.get(memory_key), peak_after=after.get(memory_key),
                        failure=failure, baseline_oom=baseline_oom)
    fix, where, changed = fix_of(treated)
    undone = next((a["overridden"] for r in treated for a in (r.evidence.last("treatment") or {}).get("applied") or []
                   if a.get("overridden")), None)
    if v not in ("failed",) and failure is None and undone:
        v, reason = "skipped", undone
    elif v not in ("failed",) and treated and failure is None and not changed:
        v, reason = "skipped", "nothing to change in this run" + (
            ": " + "; ".join(_notes(treated)) if _notes(treated) else "")
    elif v not in ("failed",) and failure is None and (eager := _ran_eager(treated)):
        v, reason = "skipped", eager
    entry: dict[str, Any] = {
        "name": name, "setting": setting, "verdict": v, "reason": reason,
        "rounds": {"baseline": len(b_med), "treated": len(t_med)},
        "baseline_step_ms": _r(median(b_med)), "treated_step_ms": _r(median(t_med)),
        "speedup": _r(sp, 3), "spread": {"baseline": _r(spread(b_med), 4), "treated": _r(spread(t_med), 4)},
        "noise_band": _r(band, 4) if b_med and t_med else None,
        "peak_memory_before": before.get(memory_key), "peak_memory_after": after.get(memory_key),
        "peak_memory_kind": kind,
        "loss_ok": lc["ok"], "loss_max_rel_diff": _r(lc["max_rel_diff"], 6),
        "loss_allowed": _r(lc["allowed"], 6) if lc["allowed"] != float("inf") else None,
        "loss_steps": lc["steps"], "loss_note": lc["note"],
        "fix": fix if v == "adopt" else "", "where": where if v == "adopt" else [],
        "step_time_basis": _basis(ok_base, [r for r in treated if r.failure() is None], name),
        "before": before, "after": after,
    }
    if failure:
        entry["error"] = failure
    slow = _slowest(ok_base, [r for r in treated if r.failure() is None])
    if slow:
        entry["slowest_ranks"] = slow
    comp = [r.evidence.last("treatment") or {} for r in treated]
    cs = [c.get("compile_s") for c in comp if c.get("compile_s") is not None]
    if cs:
        entry["compile_s"] = round(statistics.median(cs), 3)
        entry["compile_steps"] = comp[0].get("compile_steps")
    dyn = [c["dynamo"] for c in comp if c.get("dynamo")]
    if dyn:
        entry["dynamo"] = dyn[0]
    notes = _notes(treated)
    if notes:
        entry["notes"] = notes
    return entry


def _ran_eager(treated: Sequence[Any]) -> str | None:
    """Why a compile trial measured nothing: a treated run in which dynamo compiled no graph
    (its own counters, read at the run's end) ran eager; None when every run compiled or
    dynamo's counters were not read."""
    for r in treated:
        dyn = (r.evidence.last("treatment") or {}).get("dynamo")
        if dyn and (not dyn.get("graphs") or not dyn.get("ops_captured")):
            return ("the model ran eager in the trial: dynamo compiled no graph ("
                    f"{dyn.get('frames_ok', 0)} of {dyn.get('frames', 0)} frames, "
                    f"{dyn.get('graphs', 0)} graphs, {dyn.get('ops_captured', 0)} ops captured), so "
                    "the trial measured nothing; `torchdoctor compile` on a script that compiles "
                    "itself says why")
    return None


def _slowest(base: Sequence[Any], treated: Sequence[Any]) -> dict[str, list] | None:
    """Ranked runs: the rank each round was timed on (its slowest), per side; else None."""
    if not all(hasattr(r, "slowest_rank") for r in [*base, *treated]) or not [*base, *treated]:
        return None
    return {side: [r.slowest_rank(exclude=compile_steps(r)) for r in runs]
            for side, runs in (("baseline", base), ("treated", treated))}


def _basis(base: Sequence[Any], treated: Sequence[Any], name: str) -> str | None:
    """How the runs' step times were taken (docs/treat.md): one basis, or each side's."""
    sides = {r.time_basis(exclude=compile_steps(r)) for r in [*base, *treated]}
    return " / ".join(sorted(sides)) if sides else None


def _notes(runs: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for r in runs:
        for a in (r.evidence.last("treatment") or {}).get("applied") or []:
            for n in a.get("notes") or []:
                if n not in out:
                    out.append(n)
    return out


def skipped_entry(name: str, reason: str, setting: str = "") -> dict[str, Any]:
    t = BY_NAME.get(name)
    return {"name": name, "setting": setting or (t.changes if t else ""), "verdict": "skipped",
            "reason": reason, "rounds": {"baseline": 0, "treated": 0},
            "baseline_step_ms": None, "treated_step_ms": None, "speedup": None,
            "spread": {"baseline": None, "treated": None}, "noise_band": None,
            "peak_memory_before": None, "peak_memory_after": None, "peak_memory_kind": None,
            "loss_ok": None, "loss_max_rel_diff": None, "loss_allowed": None, "loss_steps": 0,
            "loss_note": "", "fix": "", "where": [], "before": {}, "after": {}}


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)
