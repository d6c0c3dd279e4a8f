"""``repro --resume-check --nproc-per-node N``: the resume check of a script that trains on N ranks.

The same check as on one process (``resume.py``), each run a torchrun launch of N ranks (the
trials layer with ``nproc_per_node``), judged rank by rank:

1. **baseline**: the script as it is on N ranks, each rank's saves described (DCP saves too:
   ``instruments/save_audit.py``) and its losses and LR traced;
2. **the checkpoint** (:func:`pick`): each rank's own choice (``saved.py`` ``choose``); the ranks
   must agree on it — the same save line, the same ordinal, the same step. A DCP save is collective
   (every rank calls ``dcp.save`` with its shards), and so is a ``torch.save`` on every rank. A save
   made by some ranks only (``if rank == 0: torch.save(...)``) is not checked: a restart resets
   every rank, and the ranks that did not save have no point of their own program at which the
   reset would fall where a restarted process takes it up (``status: not-judged``, with why);
3. **one restart per missing state** (the union of the ranks' missing states): the reset is armed
   on every rank at that save (the child options are the same on every rank), so every rank puts
   the state back to a fresh process's value right after its own part of the save;
4. **comparison per rank** (``resume_compare.compare`` on each rank's losses and LRs): a state
   whose absence changed some rank's losses is one finding, naming the ranks whose losses parted
   and, per rank, the first divergent step.

The restarts write the script's checkpoints again on every rank: the files the baseline wrote
there (a DCP checkpoint folder and its siblings: ``guard.py``) are kept aside and put back after.
Not run on N ranks: the step-by-step pair of plain ``repro`` (``distributed/oneprocess.py`` WHY).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.findings import Finding
from torchdoctor.reprocheck.resume_compare import compare, finding_for
from torchdoctor.reprocheck.saved import Missing, choose, missing_states, not_simulated

VERDICTS = ("differs", "failed", "not-reproducible", "not-applied", "same")  # a restart's, worst first


def last_step(ev: Any) -> int:
    return max((int(s.get("step") or 0) for s in ev.of("step")), default=0)


def _key(s: dict) -> tuple:
    at = s.get("reset_at") or [s.get("where"), s.get("n")]
    return str(at[0]), at[1], s.get("step")


def pick(per: dict[int, Any]) -> tuple[dict | None, str | None]:
    """(the checkpoint every rank chose, or None; why not, when some rank chose another or none).
    ``per``: {rank: its baseline TrialRun}."""
    chosen: dict[int, dict | None] = {}
    for r, run in sorted(per.items()):
        ev = run.evidence
        chosen[r] = choose(ev.of("save"), last_step(ev), (ev.last("save_sites") or {}).get("layouts"))
    saved = {r: s for r, s in chosen.items() if s is not None}
    if not saved:
        return None, None
    first_rank = min(saved)
    first = saved[first_rank]
    same = [r for r, s in saved.items() if _key(s) == _key(first)]
    if len(same) == len(chosen):
        return first, None
    from torchdoctor.runner.frames import short_path

    where = short_path(str(first.get("where")))
    others = [r for r in chosen if r not in same]
    return None, (f"the checkpoint at {where} (step {first.get('step')}) was saved by {_ranks(same)} but not "
                  f"by {_ranks(others)}: a restart resets every rank, and the ranks that did not save have no "
                  f"point of their own at which to reset (a DCP save, or a save on every rank, is checked)")


def union_missing(saves: list[dict]) -> list[Missing]:
    """The states some rank's save lacks, one entry per state (rank order, keys merged)."""
    out: dict[str, Missing] = {}
    for s in saves:
        for m in missing_states(s):
            have = out.setdefault(m.state, Missing(m.state, m.code))
            have.keys += [k for k in m.keys if k not in have.keys]
            have.names += [n for n in m.names if n not in have.names]
    return list(out.values())


def compare_ranks(base: Any, run: Any, k: int, miss: Missing) -> dict:
    """One restart compared with the baseline on every rank: the worst verdict, the first rank
    whose losses parted (its own comparison's fields), and ``ranks``: each rank's comparison."""
    why = run.failure()
    head: dict[str, Any] = {"state": miss.state, "reset": miss.keys, "names": miss.names,
                            "run": run.variation.name}
    if why:
        return {**head, "verdict": "failed", "reason": why}
    per = {r: compare(base.ranks[r], run.ranks[r], k, miss) for r in sorted(base.ranks)
           if r in (run.ranks or {})}
    if not per:
        return {**head, "verdict": "failed", "reason": "no rank of the restart left evidence"}
    verdict = next(v for v in VERDICTS if v in {c["verdict"] for c in per.values()} or v == "same")
    lead_rank = next(r for r, c in per.items() if c["verdict"] == verdict)
    out = {**per[lead_rank], "verdict": verdict, "rank": lead_rank,
           "ranks": {str(r): _rank_row(c) for r, c in per.items()}}
    if verdict == "differs":
        out["ranks_differing"] = [r for r, c in per.items() if c["verdict"] == "differs"]
    return out


def _rank_row(c: dict) -> dict:
    row = {k: c[k] for k in ("verdict", "first_divergent_step", "loss_drift", "reason", "applied") if k in c}
    if c.get("lr"):
        row["lr_first_divergent_step"] = c["lr"]["first_divergent_step"]
    return row


def ranked_finding(save: dict, miss: Missing, cmp: dict, last: int, nproc: int) -> Finding:
    """:func:`resume_compare.finding_for` of the first rank whose losses parted, naming the ranks."""
    import dataclasses

    f = finding_for(save, miss, cmp, last)
    differing = cmp.get("ranks_differing") or [cmp.get("rank")]
    lead = f"rank {cmp.get('rank')}" if len(differing) > 1 else ""
    title = f.title.replace(": resuming from this checkpoint", f": resuming {nproc} ranks from this checkpoint", 1)
    title += f"; losses differ on {_ranks(differing)}" + (f" (the figures: {lead}'s)" if lead else "")
    ev = {**f.evidence, "ranks_differing": differing, "by_rank": cmp.get("ranks"),
          "measured": f"the script run on {nproc} ranks under torchrun twice: uninterrupted, and restarted at this "
                      "save with only this state put back to a fresh process's value on every rank "
                      "(docs/resume.md)"}
    return dataclasses.replace(f, title=title, evidence=ev)


def _ranks(rs: list) -> str:
    rs = sorted(int(r) for r in rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def check(trials: Any, base: Any, section: dict, after_steps: int) -> tuple[list[Finding], dict]:
    """The ranked resume check from its baseline run (which did not fail: :func:`ranked_report`)."""
    from torchdoctor.reprocheck.resume import no_checkpoint_reason, run_restarts

    per = base.ranks or {}
    section["ranks"] = len(per)
    save, why = pick(per)
    if save is None:
        first = per[min(per)] if per else base
        return [], {**section, "status": "not-judged" if why else "no-checkpoint",
                    "reason": why or no_checkpoint_reason(first.evidence, last_step(first.evidence))}
    k = int(save["step"])
    last = min(last_step(run.evidence) for run in per.values())
    section["checkpoint"] = {"saved_at": save.get("where"), "save": save.get("n"), "step": k,
                             "file": save.get("name"), "fn": save.get("fn")}
    chosen = [choose(run.evidence.of("save"), last_step(run.evidence),
                     (run.evidence.last("save_sites") or {}).get("layouts")) for _r, run in sorted(per.items())]
    missing = union_missing([s for s in chosen if s is not None])
    section["not_simulated"] = not_simulated(save)
    if not missing:
        return [], {**section, "status": "complete", "restarts": []}
    stop = min(last, k + after_steps) if last else k + after_steps
    findings, restarts, section["own_files"], refused = run_restarts(
        trials, base, save, missing, stop, lambda run, miss: compare_ranks(base, run, k, miss),
        lambda miss, cmp: ranked_finding(save, miss, cmp, last, len(per)))
    if refused:
        return [], {**section, "status": "not-run", "reason": refused}
    verdicts = {r["verdict"] for r in restarts}
    section.update(status="inexact" if "differs" in verdicts else
                   "failed" if "failed" in verdicts else
                   "not-reproducible" if "not-reproducible" in verdicts else "exact", restarts=restarts)
    return findings, section


def ranked_report(target: str, script_args: list[str], options: Any) -> Any:
    """``repro --resume-check --nproc-per-node N``: the baseline on N ranks judged as ``checkup
    --nproc-per-node`` judges a ranked run (findings merged across ranks, the save audit's among
    them), then the resume check, whose measured findings replace the save audit's for the same
    code and save line. The step-by-step pair of plain ``repro`` is not run (listed as skipped)."""
    from torchdoctor.distributed.ranked import assemble, judge_ranks
    from torchdoctor.findings import Report
    from torchdoctor.reprocheck.resume import AFTER_STEPS, baseline_variation, supersede
    from torchdoctor.runner.signals import Stopped
    from torchdoctor.trials import Trials

    from torchdoctor.pipeline.options import RunOptions

    opts = RunOptions.of(options)
    label, n = opts.label(target), int(opts.nproc_per_node or 0)
    with Trials("repro", target, script_args, options=options) as trials:
        try:
            base = trials.run(baseline_variation())  # the main run: its writes are the user's files
        except Stopped as e:
            report = Report("repro", target=label, run_status="interrupted")
            report.skip("resume-check", f"interrupted by {e.signame} before the baseline started")
            return report
        per = {r: run.evidence for r, run in sorted((base.ranks or {}).items())}
        merged = getattr(base, "merged", None) or base.evidence  # the cross-rank evidence
        report = assemble("repro", label, per, judge_ranks("repro", per), merged, n)
        report.skip("repro", f"on {n} ranks only the resume check runs: the step-by-step comparison of two "
                             f"runs is built for one process (torchdoctor repro without --nproc-per-node)")
        resumed = None
        why = base.failure()
        if why:
            resumed = [], {"baseline": base.variation.name, "ranks": n, "status": "not-judged",
                           "reason": f"the baseline run failed: {why}"}
        elif not trials.interrupted():
            try:
                resumed = check(trials, base, {"baseline": base.variation.name}, AFTER_STEPS)
            except Stopped as e:
                report.skip("resume-check", f"interrupted by {e.signame}")
        else:
            report.skip("resume-check", f"interrupted by {trials.interrupted()}")
        if trials.interrupted():
            report.run_status = "interrupted"
    report.command = "repro"
    if resumed is not None:
        measured, section = resumed
        report.findings = supersede(report.findings, measured)
        report.metrics["resume"] = section
    return report
