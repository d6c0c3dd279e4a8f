"""Attach rules (probe ``attach``): pure functions of the evidence ``torchdoctor attach`` collected.

The evidence is the dict of ``torchdoctor/attach/session.py`` (processes with their stack samples,
the resource series, the Flight Recorder state); the views (``torchdoctor/attach/views.py``) say
where each process is and whether its main thread moved. A rank is *stuck* when its main thread
showed the same stack in every one of at least ``MIN_SAMPLES`` samples over the window.

- ``collective-hang`` (declared by the ranked run's rules, ``rules/ranks_collectives.py``): ranks
  stuck in a collective while another rank is stuck outside one or has ended.
- ``rank-waited-for``: ranks stuck in a collective while another rank is still working (its stack
  changes) and was never seen in a collective: the job is slow, not hung, and that rank is the one
  every step waits for. (A rank seen in a collective too takes turns waiting with the others: a
  balanced job sampled when one rank happened to wait every time is not a straggler.)
- ``rank-spinning``: the same picture, but the waiting ranks' main threads did not run once
  between the dumps (blocked for good: no step ends) while the other rank burns CPU in Python:
  a livelock (a polling loop whose condition never comes), not a slow step.
- ``collective-mismatch`` (declared there too): every rank stuck in a collective, but not the same
  one (op, or the same op at different lines).
- ``dataloader-worker-stuck``: a rank stuck in ``DataLoader.__next__`` whose worker is dead
  (zombie, ended) or stuck at one line.
- ``host-sync-stall``, ``gil-held-by-thread``, ``live-memory-growth``: one process's health, in
  :mod:`torchdoctor.rules.attach_process`.
"""

from __future__ import annotations

from torchdoctor.attach.views import MIN_QUIET_S, MIN_SAMPLES, ProcView, describe, groups, ranks_text, views
from torchdoctor.catalog import declare
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules.ranks_collectives import COLLECTIVE_HANG, COLLECTIVE_MISMATCH
from torchdoctor.skills import DISTRIBUTED, PERFORMANCE

SLOW_MAX_COLLECTIVE_SHARE = 0.2  # the slow rank was inside a collective in at most this share of samples
RANK_WAITED_FOR = declare(
    "rank-waited-for", DISTRIBUTED, "warning",
    "a running job's ranks wait in a collective for a rank that is still working: slow, not stuck",
    thresholds={"MIN_SAMPLES": MIN_SAMPLES, "SLOW_MAX_COLLECTIVE_SHARE": SLOW_MAX_COLLECTIVE_SHARE})
RANK_SPINNING = declare(
    "rank-spinning", DISTRIBUTED, "error",
    "a rank runs Python without end while the others wait in a collective that never completes",
    thresholds={"MIN_SAMPLES": MIN_SAMPLES, "MIN_QUIET_S": MIN_QUIET_S})
DATALOADER_WORKER_STUCK = declare(
    "dataloader-worker-stuck", PERFORMANCE, "error",
    "a rank waits for its next batch while a DataLoader worker is dead or stuck at one line",
    thresholds={"MIN_SAMPLES": MIN_SAMPLES})
PEEK_FIX = "Attach again with --duration 30 to see whether it moves; "


def _ranked(ev: dict) -> list[ProcView]:
    vs = [v for v in views(ev) if v.role == "rank"]
    if len(vs) < 2:
        raise NotApplicable("fewer than 2 ranks attached (give the job: attach --job)")
    if max((v.samples for v in vs), default=0) < MIN_SAMPLES and not any(v.gone for v in vs):
        raise NotApplicable(f"fewer than {MIN_SAMPLES} stack samples")
    return vs


def place_text(v: ProcView) -> str:
    p = v.place
    state = ("ended" if v.gone else "stuck" if v.stuck else "moving")
    at = f"{p.op} at {p.file}:{p.line}" if p.file else p.op or p.kind
    return f"{at} ({state}: {v.distinct} distinct stacks in {v.samples} samples, pid {v.pid}){_wakes(v)}"


def _fr_evidence(ev: dict) -> dict:
    fr = ev.get("flight_recorder") or {}
    if fr.get("state") != "read":
        return {}
    return {"flight_recorder": {r: {k: d.get(k) for k in ("last_completed", "first_pending", "error")
                                    if d.get(k) is not None}
                                for r, d in (fr.get("ranks") or {}).items()}}


def _spinning(ev: dict, vs: list[ProcView], waiting: list[ProcView],
              busy: list[ProcView]) -> list[Finding]:
    """The waiting ranks are stuck in a collective and their main threads never ran between the
    dumps; the busy ranks moved through Python and were never seen in a collective."""
    if not all(v.stuck and v.asleep for v in waiting) or any(v.collective_share > 0 for v in busy):
        return []
    quiet = min(v.quiet_s for v in waiting)
    parts = [describe(p, m) + f", {'its' if len(m) == 1 else 'their'} main thread"
             f"{'' if len(m) == 1 else 's'} not woken once in {quiet:.1f} s between samples"
             for p, m in groups(waiting)]
    for p, m in groups(busy):
        cpu = "; ".join(f"{v.label} used {v.cpu_s:.1f} s of CPU in {v.window_s:.1f} s" for v in m
                        if v.cpu_s is not None)
        parts.append(describe(p, m) + ", never in a collective" + (f" ({cpu})" if cpu else ""))
    who = ranks_text(busy)
    return [finding("rank-spinning",
                    f"{who} spin{'s' if len(busy) == 1 else ''} in Python while the others wait: "
                    + "; ".join(parts),
                    {**{v.label: place_text(v) for v in vs}, **_fr_evidence(ev)},
                    fix=f"{who} loops without reaching the collective the others wait in: a polling "
                        "loop whose condition never comes true (a flag only another rank sets, a "
                        "file that never appears, a retry without a bound), or a loop whose exit "
                        "depends on the rank. Read the loop at the line named; a bound on the "
                        "loop and a timeout on init_process_group turn the livelock into an error. "
                        f"(One step of {who} longer than this window reads the same: attach again "
                        "with a longer --duration; a livelock still shows.)")]


def _wakes(v: ProcView) -> str:
    if v.main_wakes is None:
        return ""
    cpu = f", {v.cpu_s:.2f} s CPU" if v.cpu_s is not None else ""
    return f"; main thread switched {v.main_wakes} times in {v.quiet_s:.1f} s between samples{cpu}"


def _slow(ev: dict, vs: list[ProcView], slow: list[ProcView]) -> list[Finding]:
    """Every other rank was inside a collective in every sample (the same one or not: each step
    it waits again) while the slow ranks moved and were never seen in one."""
    if any(v.collective_share > SLOW_MAX_COLLECTIVE_SHARE for v in slow):
        return []  # it waits in the collectives too: the ranks take turns waiting (a balanced job)
    waiting = [v for v in vs if v not in slow]
    if not waiting or any(v.kinds_seen != frozenset({"collective"}) or v.samples < MIN_SAMPLES
                          for v in waiting):
        return []
    spinning = _spinning(ev, vs, waiting, slow)
    if spinning:
        return spinning
    n = min(v.samples for v in waiting)
    parts = [f"{ranks_text(m)} wait{'s' if len(m) == 1 else ''} in a collective in all {n} samples "
             f"({p.op} at {p.at} at the last)" for p, m in groups(waiting)]
    parts += [describe(p, m) + (", never in a collective" if all(v.collective_share == 0 for v in m)
                                else ", rarely in a collective") for p, m in groups(slow)]
    who = ranks_text(slow)
    return [finding("rank-waited-for", f"{who} {'is' if len(slow) == 1 else 'are'} slow, not stuck: "
                    + "; ".join(parts), {**{v.label: place_text(v) for v in vs}, **_fr_evidence(ev)},
                    fix=f"{PEEK_FIX}profile {who}'s work at the line named (its data, a "
                        "rank-dependent branch, a slower device); the others wait for it in "
                        "every step.")]


def _fr_hang(ev: dict, vs: list[ProcView]) -> list[Finding]:
    """Every rank stuck, and the Flight Recorder shows ranks with collective N pending while other
    ranks of the same group completed only up to N-1 and have nothing pending at N: they never
    called it. (On NCCL a collective returns at once, so the waiting rank's Python stack is past it,
    at its next sync: only the recorder names the collective.)"""
    fr = ev.get("flight_recorder") or {}
    ranks = fr.get("ranks") or {}
    if fr.get("state") != "read" or len(ranks) < 2 or any("error" in d for d in ranks.values()):
        return []
    if not vs or not all(v.stuck for v in vs):
        return []  # a job that moves has collectives in flight: a snapshot of them is no hang
    pending = {r: d["first_pending"] for r, d in ranks.items()
               if d.get("first_pending") and isinstance(d["first_pending"].get("seq"), int)}
    if not pending:
        return []
    n = min(p["seq"] for p in pending.values())
    first = next(p for p in pending.values() if p["seq"] == n)
    waiting = sorted((r for r, p in pending.items() if p["seq"] == n and p.get("pg") == first.get("pg")),
                     key=int)
    missing = []
    for r, d in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        if r in waiting:
            continue
        last = d.get("last_completed") or {}
        if last.get("pg") not in (None, first.get("pg")):
            continue
        seq = last.get("seq")
        if not isinstance(seq, int) or seq < n:
            missing.append((r, last))
    if not missing:
        return []
    by_rank = {str(v.rank): v for v in vs}
    who_w = f"rank{'s' if len(waiting) > 1 else ''} {', '.join(waiting)}"
    who_m = f"rank{'s' if len(missing) > 1 else ''} {', '.join(r for r, _ in missing)}"
    parts = [f"{who_w} wait{'s' if len(waiting) == 1 else ''} in {first['op']} seq {n} "
             f"(Flight Recorder: {first.get('state')}, input sizes {first.get('input_sizes')})"]
    for r, last in missing:
        done = (f"its last collective is seq {last['seq']} ({last.get('op')}, {last.get('state')})"
                if last.get("seq") is not None else "it completed no collective")
        parts.append(f"rank {r} never called seq {n}: {done}")
    for p, m in groups([by_rank[r] for r in by_rank]):
        parts.append(describe(p, m))
    return [finding("collective-hang", "; ".join(parts),
                    {**{v.label: place_text(v) for v in vs}, **_fr_evidence(ev)},
                    fix=f"{who_m} skipped the collective the others wait in (a rank-dependent branch, "
                        "an early break, an uneven last batch) or is blocked before it at the line "
                        "named. Every rank must call the same collectives in the same order; "
                        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks this at every call, and a timeout on "
                        "init_process_group ends a hang with an error.")]


@rule("attach-collective-hang", probes={"attach"}, raises=[COLLECTIVE_HANG, RANK_WAITED_FOR, RANK_SPINNING])
def rank_waited_for(ev: dict) -> list[Finding]:
    vs = _ranked(ev)
    from_recorder = _fr_hang(ev, vs)
    if from_recorder:
        return from_recorder
    others = [v for v in vs if v.place.kind != "collective" or v.gone]
    if not others:
        return []
    slow = [v for v in others if not v.gone and not v.stuck]
    if len(slow) == len(others):
        return _slow(ev, vs, others)
    waiting = [v for v in vs if v.place.kind == "collective" and v.stuck]
    if not waiting:
        return []
    parts = [describe(p, m) for p, m in groups(waiting)]
    for p, m in groups(others):
        parts.append(describe(p, m) + ("" if p.kind in ("gone", "unreadable") else ", not in a collective"))
    title = "; ".join(parts)
    who = ranks_text(others)
    fix = (f"Look at what {who} does at the line named: a rank-dependent branch (`if rank == 0:` "
           "work, an uneven last batch, an early `break`/`continue`) skipped the collective the "
           "others wait in, or it blocks on I/O. Every rank must call the same collectives in the "
           "same order. Set a timeout on init_process_group so a hang ends with an error.")
    if any(v.gone for v in others):
        fix = (f"{who} ended (crashed or returned early) while the others wait: read its log for an "
               "exception; with torchrun the agent tears the job down only when a rank fails.")
    return [finding("collective-hang", title, {**{v.label: place_text(v) for v in vs}, **_fr_evidence(ev)},
                    fix=fix)]


@rule("attach-collective-mismatch", probes={"attach"}, raises=[COLLECTIVE_MISMATCH])
def collective_mismatch(ev: dict) -> list[Finding]:
    vs = _ranked(ev)
    waiting = [v for v in vs if v.place.kind == "collective" and v.stuck]
    if len(waiting) < 2 or any(v.place.kind != "collective" or v.gone for v in vs):
        return []
    gs = groups(waiting)
    if len(gs) < 2:
        return []
    title = "ranks wait in different collectives: " + "; ".join(describe(p, m) for p, m in gs)
    return [finding("collective-mismatch", title,
                    {**{v.label: place_text(v) for v in vs}, **_fr_evidence(ev)},
                    fix="The ranks called different collectives (or the same one from different "
                        "lines), so they were matched out of order: find the rank-dependent branch "
                        "before the lines named (a skipped or extra collective on some ranks) and "
                        "make every rank call the same collectives in the same order. "
                        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks this at every call.")]


@rule("dataloader-worker-stuck", probes={"attach"}, raises=[DATALOADER_WORKER_STUCK])
def dataloader_worker_stuck(ev: dict) -> list[Finding]:
    vs = views(ev)
    mains = [v for v in vs if v.role != "worker" and v.place.kind == "dataloader" and v.stuck]
    if not mains:
        if not any(v.role == "worker" for v in vs):
            raise NotApplicable("no DataLoader worker process found")
        return []
    out = []
    for m in mains:
        workers = [w for w in vs if w.role == "worker" and w.parent == m.pid]
        dead = [w for w in workers if w.gone or w.status in ("zombie", "dead", "gone")]
        stuck = [w for w in workers if w not in dead and w.stuck and w.place.file]
        if dead:
            what = (f"worker pid{'s' if len(dead) > 1 else ''} "
                    f"{', '.join(str(w.pid) for w in dead)} is dead ({dead[0].status or 'ended'})")
        elif stuck and len(stuck) == len(workers):
            w = stuck[0]
            what = (f"worker pid{'s' if len(stuck) > 1 else ''} {', '.join(str(s.pid) for s in stuck)} "
                    f"stuck in {w.place.function} at {w.place.at} for {w.same_for_s:.1f} s")
        else:
            continue
        out.append(finding(
            "dataloader-worker-stuck",
            f"{m.label} waits in DataLoader.__next__ at {m.place.at} for {m.same_for_s:.1f} s; {what}",
            {m.label: place_text(m), **{f"worker {w.pid}": place_text(w) + (f", {w.status}" if w.status else "")
                                    for w in workers}},
            fix="A worker that blocks forever (a lock taken before fork, a network read without a "
                "timeout, a queue never fed) stalls the loop: fix the line named; pass "
                "DataLoader(timeout=SECONDS) so a stuck worker raises instead of hanging. A dead "
                "worker was usually killed by the host OOM killer (dmesg) or crashed in native code."))
    return out
