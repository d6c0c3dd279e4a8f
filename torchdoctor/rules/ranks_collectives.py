"""Cross-rank collective rules of a ranked run (probe ``"ranks"``): collective-hang (ranks stuck:
who waits in which collective, who skipped it) and collective-mismatch (ranks called different
collectives, shapes or dtypes), from each rank's recorded collective calls, stacks and NCCL flight
recorder entries, and the error lines the error-text table recognises (``distributed/failtext.py``).
Thresholds and why: docs/findings/<code>.md.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.distributed.collectives import (describe, first_divergence, pending_fr, sequences,
                                                 shape_text, where)
from torchdoctor.distributed.failtext import MISMATCH, PEER_GONE, TIMEOUT
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.ranks import (crashed_ranks, failure_lines, rank_outcomes, rank_results,
                                     rank_stacks, rname, step_words, world_of)
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import DISTRIBUTED

COLLECTIVE_HANG = declare("collective-hang", DISTRIBUTED, "error",
                          "ranks stuck: which rank waits in which collective, and which rank skipped it")
COLLECTIVE_MISMATCH = declare("collective-mismatch", DISTRIBUTED, "error",
                              "ranks called different collectives or shapes")
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")  # point-to-point: not paired across ranks


def _seqs(ev: Evidence) -> dict[int, list[dict[str, Any]]]:
    return {r: [c for c in calls if c.get("op") not in P2P] for r, calls in sequences(ev.events).items()}



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
            elsewhere[rname(r)] = f"finished its script after {res.get('steps', 0)} steps"
        elif w.get("collective"):
            waiting[rname(r)] = f"{w['collective']} at {site}" if site else w["collective"]
        elif pend and not res.get("stopped_by_launcher") and _nccl(pend):
            last = pend[-1]
            waiting[rname(r)] = (f"{last.get('op')} #{last.get('seq')} (not completed: flight "
                              f"recorder), the script at {site or '?'}")
        elif site:
            elsewhere[rname(r)] = f"{site} in {w.get('fn')} (not in a collective)"
        elif res.get("outcome") == "not_started":
            elsewhere[rname(r)] = "never started"
        else:
            elsewhere[rname(r)] = "no stack was recorded"
    return waiting, elsewhere, places


def _nccl(entries: list[dict[str, Any]]) -> bool:
    return any(str(e.get("op", "")).startswith("nccl:") for e in entries)


def _last_calls(seqs: dict[int, list[dict[str, Any]]], world: int) -> dict[str, str]:
    out = {}
    for r in range(world):
        calls = seqs.get(r) or []
        if calls:
            c = calls[-1]
            out[rname(r)] = f"#{c.get('seq')} {describe(c)} ({step_words(int(c.get('step') or 0))})"
        else:
            out[rname(r)] = "no collective"
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
        out[rname(int(e["rank"]))] = f"last {last.get('op')} #{last.get('seq')} sizes " \
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
      needs={"collective", "dist_init", "fr_entries", "rank_result", "rank_stacks", "step"},
      raises=[COLLECTIVE_HANG, COLLECTIVE_MISMATCH])
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
    gone = failure_lines(ev, PEER_GONE)
    watchdog = failure_lines(ev, TIMEOUT)
    mismatch_msgs = failure_lines(ev, MISMATCH)
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
    out: dict[str, Any] = {"calls_recorded": {rname(r): len(seqs.get(r) or []) for r in range(world)},
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
        who = ", ".join(rname(r) for r in div["skipped_by"])
        ref = div["reference"]
        evidence["skipped"] = (f"{who} did not call {describe(miss)} "
                               f"{step_words(div['step'])} ({rname(ref)}'s call #{miss.get('seq')}); "
                               f"from there on the ranks' calls paired one off")
        cause = f"{who} skipped {describe(miss)} {step_words(div['step'])}"
    else:
        counts = {r: len(seqs.get(r) or []) for r in range(world)}
        top = max(counts.values()) if counts else 0
        behind = [r for r in range(world) if counts.get(r, 0) < top]
        if behind:
            ahead = max(range(world), key=lambda r: counts.get(r, 0))
            nxt = (seqs.get(ahead) or [None])[counts[behind[0]]] if seqs.get(ahead) else None
            who = ", ".join(rname(r) for r in behind)
            cause = f"{who} never reached {describe(nxt)}"
            evidence["behind"] = (f"{who} made {min(counts[r] for r in behind)} collective calls, "
                                  f"{rname(ahead)} {top}: the next one was {describe(nxt)}")
        else:
            cause = "every rank entered the same collectives (the transport itself is stuck, or a " \
                    "collective issued outside Python such as DDP's differs)"
    if waiting:
        evidence["waiting"] = waiting
    if elsewhere:
        evidence["elsewhere"] = elsewhere
    lines = failure_lines(ev, PEER_GONE + TIMEOUT)
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
            per = {rname(r): f"{e.get('op')} sizes {e.get('sizes')} {e.get('dtypes')}"
                   for r, e in frd["per_rank"].items()}
            evidence["flight_recorder_call"] = {"seq": frd["seq"], **per}
            title = (f"ranks issued different collectives at flight-recorder call #{frd['seq']}: "
                     + "; ".join(f"{k} {v}" for k, v in per.items()))
        else:
            title = "torch reported a collective mismatch between ranks: " + \
                    (failure_lines(ev, MISMATCH) or ["(see the errors)"])[0]
    elif div["kind"] == "skip":
        miss = div["missing"]
        who = ", ".join(rname(r) for r in div["skipped_by"])
        title = (f"{who} skipped {describe(miss)} {step_words(div['step'])}; the ranks' later "
                 f"collectives paired one off")
        evidence["skipped"] = f"{rname(div['reference'])}'s call #{miss.get('seq')}: {describe(miss)}"
        evidence["next_call"] = {rname(r): describe(c) for r, c in div["next"].items()}
    elif div["kind"] == "op":
        per = div["per_rank"]
        seq = next((c.get("seq") for c in per.values() if c), "?")
        title = (f"ranks called different collectives as call #{seq} {step_words(div['step'])}: "
                 + "; ".join(f"{rname(r)} {describe(c)}" for r, c in per.items()))
        evidence["calls"] = {rname(r): describe(c) for r, c in per.items()}
    else:
        per = div["per_rank"]
        any_rec = next(iter(per.values()))
        what = "shapes" if div["kind"] == "shape" else "dtypes"
        title = (f"ranks called {describe(any_rec)} with different {what} "
                 f"{step_words(div['step'])}: "
                 + ", ".join(f"{rname(r)} {shape_text(c)}" for r, c in per.items()))
        evidence["call"] = f"#{any_rec.get('seq')} {describe(any_rec)}"
        evidence[what] = {rname(r): shape_text(c) for r, c in per.items()}
    errs = failure_lines(ev)
    if errs:
        evidence["errors"] = errs
    evidence.update(_common_evidence(ev, world, seqs))
    fix = ("Make every rank pass tensors of the same shape and dtype to each collective, and call "
           "the same collectives in the same order (no rank- or data-dependent branch around "
           "them; pad variable-size data to a common shape first); TORCH_DISTRIBUTED_DEBUG=DETAIL "
           "makes torch check each call across ranks")
    return finding("collective-mismatch", title, evidence, fix=fix)
