"""A script probe on N ranks (``--nproc-per-node N``): one merged report from the rank dirs.

Flow (launched by :func:`torchdoctor.pipeline.run.run_ranked`): run dir ``D`` (temporary, or
``--out DIR`` → ``DIR/run``) → ``launch`` with a ``RankSet`` (the harness on every rank,
``D/rank{R}``) → here: per rank, the pipeline of a
single run (``pipeline/judging.py``: rules of ``"run"`` and the probe; follow-ups listed as
skipped, since a re-run would need the whole torchrun) → findings merged across ranks (one finding
per code, with the ranks that raised it) → cross-rank rules (probe ``"ranks"``: collectives,
samplers, stragglers) → secondary failures folded into the finding that explains them (a rank
torchrun stopped because another failed; the crash or hang a collective mismatch caused) →
metrics (rank 0's families, plus ``ranks``: per-rank step times and arrival lags).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torchdoctor.distributed.failtext import own_crash
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, Report

DIST_CODES = ("collective-hang", "collective-mismatch")
# per-rank findings that a collective hang/mismatch explains (they are its symptoms)
SYMPTOM_CODES = ("script-hung", "killed-by-signal", "script-crashed")


def judge(probe: str, target: str, run_dir: str | Path, nproc: int) -> Report:
    """The merged report of a ranked run dir (pure apart from reading the files)."""
    from torchdoctor.evidence.ranks import merged_evidence

    per, merged = merged_evidence(run_dir, nproc)
    return assemble(probe, target, per, judge_ranks(probe, per), merged, nproc)


def judge_ranks(probe: str, per: dict[int, Evidence]) -> dict[int, Report]:
    """Each rank judged as a single run (no relaunch: follow-ups listed as skipped)."""
    from torchdoctor.pipeline.judging import judge_run

    return {r: judge_run(probe, ev, metrics=False) for r, ev in sorted(per.items())}


def assemble(probe: str, target: str, per: dict[int, Evidence], rank_reports: dict[int, Report],
             merged: Evidence, nproc: int, *, cross_rank: bool = True,
             ranks: list[int] | None = None) -> Report:
    """One report from the ranks' own reports and the cross-rank Evidence: merged findings,
    cross-rank rules (unless ``cross_rank`` is False), metrics of the first rank in ``per``,
    per-rank rows (``ranks``: the rank labels, default 0..nproc-1)."""
    from torchdoctor.distributed.stragglers import rank_summary
    from torchdoctor.judge import judge as apply_rules
    from torchdoctor.pipeline.judging import add_metrics, context_of, run_status

    report = Report(command=probe, target=target)
    first = per[min(per)] if per else Evidence()
    report.context = {**context_of(first), "ranks": nproc}
    cross = Report(command=probe)
    if cross_rank:
        apply_rules("ranks", merged, cross)
    merge_findings(report, rank_reports, cross, merged, nproc)
    if per:
        scratch = Report(command=probe)
        add_metrics(first, scratch)  # the first rank's families (steps, memory, profile, nan...)
        report.metrics.update(scratch.metrics)
        report.findings.extend(f for f in scratch.findings if f.code == "internal-error")
        if isinstance(report.metrics.get("memory"), dict):
            from torchdoctor.evidence.memranks import memory_by_rank

            by_rank = memory_by_rank(per)  # each rank's peak, which rank is highest, the skew
            if by_rank:
                report.metrics["memory"]["by_rank"] = by_rank
        from torchdoctor.evidence.commranks import collectives_by_rank

        comm = collectives_by_rank(per)  # each rank's collectives: time, exposed, bytes, busbw
        if comm:
            report.metrics["collectives"] = comm
    summary = rank_summary(merged.events, nproc, ranks)
    if summary:
        report.metrics["ranks"] = summary
    first_run = report.metrics.get("run", {})  # the first rank's own: keep only its start-up time
    report.metrics["run"] = {**{k: v for k, v in first_run.items() if k == "time_to_first_step_s"},
                             **_run_metrics(merged)}
    for r, ev in sorted(per.items()):
        for a in ev.of("artifact"):
            if a.get("name") and a.get("path"):
                report.artifacts[f"rank{r}.{a['name']}" if r else str(a["name"])] = str(a["path"])
    report.run_status = run_status(merged.result.get("outcome"))
    return report


def _run_metrics(merged: Evidence) -> dict[str, Any]:
    res = merged.result
    out = {k: res[k] for k in ("outcome", "exit_code", "failed_rank", "signal", "timeout_s",
                               "wall_s", "steps", "launcher_returncode", "interrupted_by",
                               "killed_after_interrupt", "processes_left", "flight_recorder")
           if res.get(k) is not None}
    out["ranks"] = res.get("ranks") or []
    return out


def merge_findings(report: Report, rank_reports: dict[int, Report], cross: Report,
                   merged: Evidence, nproc: int) -> None:
    """One finding per code across ranks; symptoms folded into the finding that explains them."""
    results = {int(e["rank"]): e for e in merged.of("rank_result")}
    explained = {f.code for f in cross.findings} & set(DIST_CODES)
    stopped = {r for r, res in results.items() if res.get("stopped_by_launcher")}
    # a rank that raised in its own code is the failure; the others' errors follow from it
    own = {r for r, res in results.items() if own_crash(res)} if not explained else set()
    failed_first = merged.result.get("failed_rank")
    by_code: dict[str, list[tuple[int, Finding]]] = {}
    folded: dict[str, str] = {}
    for r, rep in sorted(rank_reports.items()):
        for f in rep.findings:
            if f.code in SYMPTOM_CODES and (explained or r in stopped or (own and r not in own)):
                if r in stopped and not explained:
                    folded[f"rank {r}"] = f"stopped by torchrun after rank {failed_first} failed"
                elif own and r not in own:
                    folded[f"rank {r}"] = (f"failed after rank {min(own)} crashed: "
                                           f"{visible_first_line(f.title)}")
                continue
            by_code.setdefault(f.code, []).append((r, f))
    received = _fold_received_gradients(by_code)
    for code, items in by_code.items():
        report.add(_merge_one(items, nproc, folded if code in SYMPTOM_CODES else received.get(code)))
    for f in cross.findings:
        report.add(f)
    seen: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    for r, rep in sorted(rank_reports.items()):
        for s in rep.skipped:
            seen.setdefault(s.rule, []).append(r)
            reasons.setdefault(s.rule, s.reason)
    for rule_name, ranks in seen.items():
        suffix = "" if len(ranks) == nproc else f" (rank {', '.join(map(str, ranks))})"
        report.skip(rule_name, reasons[rule_name] + suffix)
    for s in cross.skipped:
        report.skip(s.rule, s.reason)


# where a non-finite value can start on a rank: its own forward or loss (the data it was given)
ORIGIN_CODES = ("nonfinite-forward", "nonfinite-loss")


def _fold_received_gradients(by_code: dict[str, list[tuple[int, Finding]]]) -> dict[str, dict[str, str]]:
    """A rank whose forward and loss were finite but whose gradients were not, at the step (or
    after the step) where another rank's forward or loss went non-finite, received them through
    the gradient reduction (DDP's all-reduce, FSDP's reduce-scatter): its nonfinite-gradient is
    that rank's symptom, folded into the origin's finding. Returns {origin code: {"rank R": why}}
    and removes the folded items from ``by_code``."""
    origins = [(f.evidence.get("step"), code, r) for code in ORIGIN_CODES
               for r, f in by_code.get(code, []) if isinstance(f.evidence.get("step"), int)]
    grads = by_code.get("nonfinite-gradient")
    if not origins or not grads:
        return {}
    step0, code0, rank0 = min(origins)
    out: dict[str, str] = {}
    keep = []
    for r, f in grads:
        step = f.evidence.get("step")
        if isinstance(step, int) and step >= step0 and r not in {o[2] for o in origins}:
            out[f"rank {r}"] = (f"non-finite gradients from step {step} with a finite forward and "
                                f"loss: received from rank {rank0} through the gradient reduction")
        else:
            keep.append((r, f))
    if keep:
        by_code["nonfinite-gradient"] = keep
    else:
        del by_code["nonfinite-gradient"]
    return {code0: out} if out else {}


def visible_first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _merge_one(items: list[tuple[int, Finding]], nproc: int, folded: dict[str, str] | None) -> Finding:
    ranks = [r for r, _ in items]
    r0, f = items[0]
    evidence = {"ranks": "all" if len(set(ranks)) == nproc else [f"rank {r}" for r in ranks],
                **f.evidence}
    others = {f"rank {r}": g.title for r, g in items[1:] if g.title != f.title}
    if others:
        evidence["other_ranks"] = dict(list(others.items())[:8])
    if folded:
        evidence["other_rank_outcomes"] = folded
    title = f.title if len(set(ranks)) == nproc else f"rank {r0}: {f.title}"
    return dataclasses.replace(f, title=title, evidence=evidence)
