"""Cross-rank rules of a ranked run (``--nproc-per-node``; probe ``"ranks"``).

They judge the merged Evidence of :mod:`torchdoctor.distributed.merge` (every event carries its
``rank``): collective sequences and stacks (collective-hang, collective-mismatch), the
DataLoader facts (missing-distributed-sampler, sampler-epoch-not-set) and the per-rank
step arrivals (rank-straggler). Thresholds and why: docs/findings/<code>.md.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any

from torchdoctor.distributed.failtext import (COLLECTIVE_FAILURE_TEXT, MISMATCH_TEXT, PEER_GONE_TEXT,
                                       TIMEOUT_TEXT, own_crash)
from torchdoctor.distributed.collectives import (describe, first_divergence, pending_fr, sequences,
                                          shape_text, where)
from torchdoctor.distributed.stragglers import PHASES, device_table, lag_table, per_rank_steps, step_medians
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.runner.frames import short_path

# rank-straggler: last to arrive in at least LAST_SHARE of the judged steps, by a median lag
# of at least LAG_FRACTION of the median step time and at least LAG_MIN_S, over MIN_STEPS+,
# and its own work (outside backward and collectives) longer than the others' by at least
# OWN_SHARE of that lag (else it is only late from leaving the last collective late)
LAST_SHARE = 0.75
LAG_FRACTION = 0.10
LAG_MIN_S = 0.002
OWN_SHARE = 0.5
MIN_STEPS = 5
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
# what collective failures print (gloo, NCCL, TORCH_DISTRIBUTED_DEBUG=DETAIL): torchdoctor.distributed.failtext


# ----------------------------------------------------------------------------- helpers
def world_of(ev: Evidence) -> int:
    return int(ev.meta.get("world_size") or 0)


def rank_results(ev: Evidence) -> dict[int, dict[str, Any]]:
    return {int(e["rank"]): e for e in ev.of("rank_result")}


def rank_stacks(ev: Evidence) -> dict[int, dict[str, Any]]:
    return {int(e["rank"]): e for e in ev.of("rank_stacks")}


def _r(r: int) -> str:
    return f"rank {r}"


def failure_lines(ev: Evidence, pattern: re.Pattern = COLLECTIVE_FAILURE_TEXT) -> list[str]:
    """Lines of the ranks' exceptions and of the run's output that match ``pattern``."""
    out: list[str] = []
    for r, res in sorted(rank_results(ev).items()):
        msg = (res.get("exception") or {}).get("message") or ""
        for ln in msg.splitlines():
            if pattern.search(ln) and ln.strip():
                out.append(f"rank {r}: {ln.strip()[:300]}")
                break
    for ln in ev.result.get("output_tail") or []:
        if pattern.search(ln) and not ln.lstrip().startswith(("File ", "raise ", "return ")):
            t = ln.strip()[:300]
            if t and t not in out:
                out.append(t)
    return out[:6]


def crashed_ranks(ev: Evidence) -> list[int]:
    """Ranks that raised in their own code (not a collective failure caused by another rank)."""
    return [r for r, res in sorted(rank_results(ev).items()) if own_crash(res)]


def rank_outcomes(ev: Evidence) -> dict[str, str]:
    """'rank R' -> how it ended, in words (for the evidence of a cross-rank finding)."""
    out = {}
    for r, res in sorted(rank_results(ev).items()):
        o = res.get("outcome")
        if res.get("stopped_by_launcher"):
            text = f"stopped by torchrun ({res.get('signal')}) after another rank failed"
        elif o == "crash":
            exc = res.get("exception") or {}
            first = next((ln for ln in (exc.get("message") or "").splitlines() if ln.strip()), "")
            text = f"raised {exc.get('type')}: {first[:200]}"
        elif o == "signal":
            text = f"died by {res.get('signal')}"
        elif o == "timeout":
            text = "still running at the timeout (killed)"
        elif o in ("exit", "stopped"):
            text = f"{'stopped at --steps' if o == 'stopped' else 'exited'} (code " \
                   f"{res.get('exit_code', 0)}) after {res.get('steps', 0)} steps"
        else:
            text = str(o)
        out[_r(r)] = text
    return out


def _seqs(ev: Evidence) -> dict[int, list[dict[str, Any]]]:
    return {r: [c for c in calls if c.get("op") not in P2P] for r, calls in sequences(ev.events).items()}


def _step_words(step: int) -> str:
    """When a call was made, by the optimizer steps completed (the recorder's ``step``)."""
    if step <= 0:
        return "before the first optimizer step"
    return f"after {step} optimizer step{'s' if step != 1 else ''}"


# ----------------------------------------------------------------------------- collectives
def _waits(ev: Evidence, world: int, seqs: dict[int, list[dict[str, Any]]]
           ) -> tuple[dict[str, str], dict[str, str], dict[int, dict[str, Any]]]:
    """(waiting: rank -> collective it is blocked in, elsewhere: rank -> where it is, where)."""
    results = rank_results(ev)
    stacks = rank_stacks(ev)
    fr = {int(e["rank"]): e for e in ev.of("fr_entries")}
    waiting: dict[str, str] = {}
    elsewhere: dict[str, str] = {}
    places: dict[int, dict[str, Any]] = {}
    for r in range(world):
        res = results.get(r, {})
        w = where(stacks.get(r))
        places[r] = w
        site = short_path(w.get("site")) if w.get("site") else None
        pend = pending_fr((fr.get(r) or {}).get("entries") or [])
        if res.get("outcome") in ("exit", "stopped"):
            elsewhere[_r(r)] = f"finished its script after {res.get('steps', 0)} steps"
        elif w.get("collective"):
            waiting[_r(r)] = f"{w['collective']} at {site}" if site else w["collective"]
        elif pend and not res.get("stopped_by_launcher") and _nccl(pend):
            last = pend[-1]
            waiting[_r(r)] = (f"{last.get('op')} #{last.get('seq')} (not completed: flight "
                              f"recorder), the script at {site or '?'}")
        elif site:
            elsewhere[_r(r)] = f"{site} in {w.get('fn')} (not in a collective)"
        elif res.get("outcome") == "not_started":
            elsewhere[_r(r)] = "never started"
        else:
            elsewhere[_r(r)] = "no stack was recorded"
    return waiting, elsewhere, places


def _nccl(entries: list[dict[str, Any]]) -> bool:
    return any(str(e.get("op", "")).startswith("nccl:") for e in entries)


def _last_calls(seqs: dict[int, list[dict[str, Any]]], world: int) -> dict[str, str]:
    out = {}
    for r in range(world):
        calls = seqs.get(r) or []
        if calls:
            c = calls[-1]
            out[_r(r)] = f"#{c.get('seq')} {describe(c)} ({_step_words(int(c.get('step') or 0))})"
        else:
            out[_r(r)] = "no collective"
    return out


def _fr_summary(ev: Evidence) -> dict[str, str]:
    out = {}
    for e in ev.of("fr_entries"):
        ents = e.get("entries") or []
        if not ents:
            continue
        last = ents[-1]
        pend = pending_fr(ents)
        state = "not completed" if (pend and pend[-1] is last and _nccl(ents)) else last.get("state")
        out[_r(int(e["rank"]))] = f"last {last.get('op')} #{last.get('seq')} sizes " \
                                  f"{last.get('sizes')} ({state})"
    return out


def fr_divergence(ev: Evidence) -> dict[str, Any] | None:
    """First flight-recorder sequence number where the ranks' entries differ (op or sizes)."""
    by: dict[int, dict[tuple, dict[str, Any]]] = {}
    for e in ev.of("fr_entries"):
        by[int(e["rank"])] = {(x.get("pg"), x.get("seq")): x for x in e.get("entries") or []
                              if not x.get("p2p")}
    if len(by) < 2:
        return None
    common = set.intersection(*(set(v) for v in by.values()))
    for key in sorted(common, key=lambda k: (str(k[0]), k[1] or 0)):
        vals = {r: (by[r][key].get("op"), repr(by[r][key].get("sizes"))) for r in by}
        if len(set(vals.values())) > 1:
            return {"seq": key[1], "per_rank": {r: by[r][key] for r in sorted(by)}}
    return None


@rule("collectives", probes={"ranks"},
      needs={"collective", "dist_init", "fr_entries", "step", "rank_result", "rank_stacks"},
      raises=["collective-hang", "collective-mismatch"])
def collectives(ev: Evidence) -> list[Finding]:
    """collective-hang (ranks stuck, who skipped) or collective-mismatch (ops or shapes differ)."""
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank: no collective to compare")
    seqs = _seqs(ev)
    results = rank_results(ev)
    if not seqs and not ev.of("dist_init") and not ev.of("fr_entries"):
        raise NotApplicable("the script made no torch.distributed call")
    complete = {r: 0 for r in range(world)}  # steps each rank completed (a killed rank has no result)
    for e in ev.of("step"):
        r = int(e.get("rank", 0))
        complete[r] = max(complete.get(r, 0), int(e.get("step", 0)))
    div = first_divergence(seqs, complete)
    timed_out = ev.result.get("outcome") == "timeout"
    gone = failure_lines(ev, PEER_GONE_TEXT)
    watchdog = failure_lines(ev, TIMEOUT_TEXT)
    mismatch_msgs = failure_lines(ev, MISMATCH_TEXT)
    interrupted = ev.result.get("outcome") == "interrupted" or bool(ev.result.get("interrupted"))
    if crashed_ranks(ev) and not mismatch_msgs:
        return []  # a rank raised in its own code: the others' collective errors follow from it
    hung = timed_out or interrupted or bool(gone) or bool(watchdog)
    if div is not None and div["kind"] == "skip" and (hung or not mismatch_msgs):
        if hung:
            return [_hang_finding(ev, world, seqs, div)]
        return [_mismatch_finding(ev, world, seqs, div)]
    if div is not None:
        return [_mismatch_finding(ev, world, seqs, div)]
    if mismatch_msgs:
        return [_mismatch_finding(ev, world, seqs, None)]
    if hung:
        waiting, _elsewhere, _ = _waits(ev, world, seqs)
        if waiting or watchdog or gone:
            return [_hang_finding(ev, world, seqs, None)]
    return []


def _common_evidence(ev: Evidence, world: int, seqs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"calls_recorded": {_r(r): len(seqs.get(r) or []) for r in range(world)},
                           "last_calls": _last_calls(seqs, world), "ranks": rank_outcomes(ev)}
    fr = _fr_summary(ev)
    if fr:
        out["flight_recorder"] = fr
    return out


def _hang_finding(ev: Evidence, world: int, seqs: dict[int, list[dict[str, Any]]],
                  div: dict[str, Any] | None) -> Finding:
    waiting, elsewhere, _ = _waits(ev, world, seqs)
    evidence: dict[str, Any] = {}
    if div is not None:
        miss = div["missing"]
        who = ", ".join(_r(r) for r in div["skipped_by"])
        ref = div["reference"]
        evidence["skipped"] = (f"{who} did not call {describe(miss)} "
                               f"{_step_words(div['step'])} ({_r(ref)}'s call #{miss.get('seq')}); "
                               f"from there on the ranks' calls paired one off")
        cause = f"{who} skipped {describe(miss)} {_step_words(div['step'])}"
    else:
        counts = {r: len(seqs.get(r) or []) for r in range(world)}
        top = max(counts.values()) if counts else 0
        behind = [r for r in range(world) if counts.get(r, 0) < top]
        if behind:
            ahead = max(range(world), key=lambda r: counts.get(r, 0))
            nxt = (seqs.get(ahead) or [None])[counts[behind[0]]] if seqs.get(ahead) else None
            who = ", ".join(_r(r) for r in behind)
            cause = f"{who} never reached {describe(nxt)}"
            evidence["behind"] = (f"{who} made {min(counts[r] for r in behind)} collective calls, "
                                  f"{_r(ahead)} {top}: the next one was {describe(nxt)}")
        else:
            cause = "every rank entered the same collectives (the transport itself is stuck, or a " \
                    "collective issued outside Python such as DDP's differs)"
    if waiting:
        evidence["waiting"] = waiting
    if elsewhere:
        evidence["elsewhere"] = elsewhere
    lines = failure_lines(ev, re.compile(PEER_GONE_TEXT.pattern + "|" + TIMEOUT_TEXT.pattern, re.I))
    if lines:
        evidence["errors"] = lines
    if ev.result.get("outcome") == "timeout":
        evidence["timeout_s"] = ev.result.get("timeout_s")
        evidence["stacks"] = "rank{R}/stacks.txt in the run dir: every thread of every rank at the timeout"
    elif ev.result.get("interrupted"):
        evidence["interrupted"] = "Ctrl-C: stacks taken then; the ranks still blocked were killed"
        evidence["stacks"] = "rank{R}/stacks.txt in the run dir: every thread of every rank at Ctrl-C"
    evidence.update(_common_evidence(ev, world, seqs))
    wait_txt = "; ".join(f"{k} waits in {v}" for k, v in waiting.items())
    title = f"collective hang: {cause}" + (f"; {wait_txt}" if wait_txt else "")
    if elsewhere and not waiting:
        title += "; " + "; ".join(f"{k}: {v}" for k, v in elsewhere.items())
    fix = ("Make every rank call the same collectives in the same order: move the collective out "
           "of the rank- or data-dependent branch (or add the matching call on the other ranks); "
           "set init_process_group(timeout=...) so a hang raises; re-run with "
           "TORCH_DISTRIBUTED_DEBUG=DETAIL to have torch check each collective across ranks")
    return finding("collective-hang", title, evidence, fix=fix)


def _mismatch_finding(ev: Evidence, world: int, seqs: dict[int, list[dict[str, Any]]],
                      div: dict[str, Any] | None) -> Finding:
    evidence: dict[str, Any] = {}
    if div is None:
        frd = fr_divergence(ev)
        if frd is not None:
            per = {_r(r): f"{e.get('op')} sizes {e.get('sizes')} {e.get('dtypes')}"
                   for r, e in frd["per_rank"].items()}
            evidence["flight_recorder_call"] = {"seq": frd["seq"], **per}
            title = (f"ranks issued different collectives at flight-recorder call #{frd['seq']}: "
                     + "; ".join(f"{k} {v}" for k, v in per.items()))
        else:
            title = "torch reported a collective mismatch between ranks: " + \
                    (failure_lines(ev, MISMATCH_TEXT) or ["(see the errors)"])[0]
    elif div["kind"] == "skip":
        miss = div["missing"]
        who = ", ".join(_r(r) for r in div["skipped_by"])
        title = (f"{who} skipped {describe(miss)} {_step_words(div['step'])}; the ranks' later "
                 f"collectives paired one off")
        evidence["skipped"] = f"{_r(div['reference'])}'s call #{miss.get('seq')}: {describe(miss)}"
        evidence["next_call"] = {_r(r): describe(c) for r, c in div["next"].items()}
    elif div["kind"] == "op":
        per = div["per_rank"]
        seq = next((c.get("seq") for c in per.values() if c), "?")
        title = (f"ranks called different collectives as call #{seq} {_step_words(div['step'])}: "
                 + "; ".join(f"{_r(r)} {describe(c)}" for r, c in per.items()))
        evidence["calls"] = {_r(r): describe(c) for r, c in per.items()}
    else:
        per = div["per_rank"]
        any_rec = next(iter(per.values()))
        what = "shapes" if div["kind"] == "shape" else "dtypes"
        title = (f"ranks called {describe(any_rec)} with different {what} "
                 f"{_step_words(div['step'])}: "
                 + ", ".join(f"{_r(r)} {shape_text(c)}" for r, c in per.items()))
        evidence["call"] = f"#{any_rec.get('seq')} {describe(any_rec)}"
        evidence[what] = {_r(r): shape_text(c) for r, c in per.items()}
    errs = failure_lines(ev)
    if errs:
        evidence["errors"] = errs
    evidence.update(_common_evidence(ev, world, seqs))
    fix = ("Make every rank pass tensors of the same shape and dtype to each collective, and call "
           "the same collectives in the same order (no rank- or data-dependent branch around "
           "them; pad variable-size data to a common shape first); TORCH_DISTRIBUTED_DEBUG=DETAIL "
           "makes torch check each call across ranks")
    return finding("collective-mismatch", title, evidence, fix=fix)


# ----------------------------------------------------------------------------- samplers
def _loaders(ev: Evidence, events: list[dict[str, Any]] | None = None
             ) -> dict[tuple, dict[int, list[dict[str, Any]]]]:
    """(loader index, loop site) -> {rank: its dist_loader events, one per epoch}."""
    out: dict[tuple, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for e in (ev.of("dist_loader") if events is None else events):
        out[(e.get("loader"), e.get("site"))][int(e["rank"])].append(e)
    return out


@rule("missing-distributed-sampler", probes={"ranks"}, needs={"dist_loader", "dist_batch"},
      raises=["missing-distributed-sampler"])
def missing_distributed_sampler(ev: Evidence) -> list[Finding]:
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank")
    loaders = _loaders(ev)
    if not loaders:
        raise NotApplicable("no DataLoader was iterated")
    prints = {(int(e["rank"]), e.get("loader")): e.get("fingerprint") for e in ev.of("dist_batch")}
    findings, why_not = [], []
    for (idx, site), by_rank in sorted(loaders.items(), key=lambda kv: str(kv[0])):
        if len(by_rank) < world:
            continue  # not iterated on every rank (e.g. evaluation on rank 0 only)
        first = {r: evs[0] for r, evs in by_rank.items()}
        if any((e.get("world_size") or 1) < 2 for e in first.values()):
            why_not.append(f"loader at {short_path(site)}: iterated outside a process group")
            continue
        kinds = {e.get("sampler_kind") for e in first.values()}
        if kinds != {"stock"}:
            continue
        fps = {r: prints.get((r, idx)) for r in by_rank}
        if None in fps.values() or len(set(fps.values())) != 1:
            why_not.append(f"loader at {short_path(site)}: the ranks' first batches differ "
                           f"(shuffled with different seeds, or per-rank data): not judged")
            continue
        e0 = first[min(first)]
        sampler = e0.get("sampler")
        evidence = {"loop": short_path(site), "sampler": sampler, "dataset": e0.get("dataset"),
                    "dataset_len": e0.get("dataset_len"),
                    "batches_per_epoch": {_r(r): e.get("batches") for r, e in sorted(first.items())},
                    "first_batch": f"identical on all {world} ranks (content fingerprint)"}
        findings.append(finding(
            "missing-distributed-sampler",
            f"every rank reads the same samples: the DataLoader at {short_path(site)} draws from "
            f"a {sampler} over the whole {e0.get('dataset')} ({e0.get('dataset_len')} samples) "
            f"on each of the {world} ranks; their first batches were identical",
            evidence,
            fix="Pass sampler=DistributedSampler(dataset) to the DataLoader (drop shuffle=True: the "
                "sampler shuffles) and call sampler.set_epoch(epoch) at the start of each epoch; "
                "each rank then reads 1/world_size of the data per epoch"))
    if not findings and why_not and not any(
            {e[0].get("sampler_kind") for e in by.values()} == {"distributed"} for by in loaders.values()):
        raise NotApplicable("; ".join(why_not[:3]))
    return findings


def _training_epochs(ev: Evidence) -> list[dict[str, Any]]:
    """The ``dist_loader`` events of iterators that fed training steps: the epochs.

    An iterator counts when an optimizer step happened between its creation and the next
    iterator of the same loader on the same rank (or the end of the run), wherever in the
    script either was made. One made and dropped with no step in between is a peek, e.g. the
    DDP tutorial's ``len(next(iter(loader))[0])`` before ``set_epoch``: it holds the previous
    epoch's number and is not an epoch. Events without a step count (older evidence) all count.
    """
    last_step: dict[int, int] = {}
    for s in ev.of("step"):
        if s.get("rank") is not None and s.get("step") is not None:
            r = int(s["rank"])
            last_step[r] = max(last_step.get(r, 0), int(s["step"]))
    per: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in ev.of("dist_loader"):
        per[(int(e["rank"]), e.get("loader"))].append(e)
    keep: list[dict[str, Any]] = []
    for (rank, _idx), evs in per.items():
        evs = sorted(evs, key=lambda e: e.get("iter") or 0)
        for i, e in enumerate(evs):
            made = e.get("step")
            end = evs[i + 1].get("step") if i + 1 < len(evs) else last_step.get(rank)
            if made is None or end is None or int(end) > int(made):
                keep.append(e)
    return keep


@rule("sampler-epoch-not-set", probes={"ranks"}, needs={"dist_loader", "step"},
      raises=["sampler-epoch-not-set"])
def sampler_epoch_not_set(ev: Evidence) -> list[Finding]:
    world = world_of(ev)
    if world < 2:
        raise NotApplicable("one rank")
    loaders = _loaders(ev, _training_epochs(ev))
    judged = 0
    hits: dict[tuple, dict[int, list]] = {}
    for key, by_rank in loaders.items():
        for r, evs in by_rank.items():
            if evs[0].get("sampler_kind") != "distributed" or not evs[0].get("shuffle"):
                continue
            if len(evs) < 2:
                continue
            judged += 1
            epochs = [e.get("epoch") for e in evs]
            if any(a == b for a, b in zip(epochs, epochs[1:])):
                hits.setdefault(key, {})[r] = epochs
    if not judged:
        if any(by[r][0].get("sampler_kind") == "distributed" for by in _loaders(ev).values() for r in by):
            raise NotApplicable("no shuffling DistributedSampler fed training steps for two epochs")
        raise NotApplicable("no DataLoader with a DistributedSampler")
    out = []
    for (idx, site), by_rank in hits.items():
        ranks = sorted(by_rank)
        epochs = by_rank[ranks[0]]
        out.append(finding(
            "sampler-epoch-not-set",
            f"DistributedSampler.set_epoch is not called between epochs: the DataLoader at "
            f"{short_path(site)} ran {len(epochs)} epochs with the sampler's epoch at "
            f"{epochs}, so every epoch repeats the same shuffled order",
            {"loop": short_path(site), "sampler_epochs": epochs, "epochs_run": len(epochs),
             "ranks": "all" if len(ranks) == world else [_r(r) for r in ranks]},
            fix="Call loader.sampler.set_epoch(epoch) at the start of every epoch, before "
                "iterating the DataLoader"))
    return out


# ----------------------------------------------------------------------------- stragglers
@rule("rank-straggler", probes={"ranks"}, needs={"step", "dist_step", "step_device"},
      raises=["rank-straggler"])
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
    meds = {q: step_medians(v) for q, v in steps.items()}
    step_s = statistics.median([m["median_step_s"] for m in meds.values() if m]) if meds else 0.0
    if lt["basis"] == "device":
        step_s = lt["median_span_s"]
    need = max(LAG_FRACTION * step_s, LAG_MIN_S)
    excess = lt["own_excess_s"].get(r, 0.0)
    if shares[r] < LAST_SHARE or lags[r] < need or excess < OWN_SHARE * lags[r]:
        return []
    evidence: dict[str, Any] = {
        "rank": r, "basis": "CUDA events: device time outside backward" if lt["basis"] == "device"
        else "host clock: arrival at backward, work outside backward and collectives",
        "median_lag_ms": round(lags[r] * 1e3, 2),
        "last_to_arrive": f"{shares[r]:.0%} of {lt['steps']} steps",
        "median_step_ms": round(step_s * 1e3, 2),
        "others_wait": f"{lags[r] / step_s:.0%} of each step" if step_s else None,
        "own_work_excess_ms": round(excess * 1e3, 2),
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
