"""``treat --nproc-per-node N``: the treat schedule with every run a torchrun launch of N ranks.

The schedule is :class:`~torchdoctor.treat.session.TreatSession`'s (baseline and trials in
alternating rounds, the order reversed every other round, the combined trial, the budget,
Ctrl-C), with three differences:

* each run is one launch of every rank (the trials layer with ``nproc_per_node``:
  :class:`~torchdoctor.trials.ranked.RankedTrialRun`), timed on the **slowest rank**; a rank that
  crashes under a trial makes that trial ``failed`` with the rank and its error;
* the baseline is judged as ``checkup --nproc-per-node N`` judges a ranked run
  (:func:`torchdoctor.distributed.ranked.judge`: per-rank rules, findings merged across ranks,
  cross-rank rules; follow-ups listed as skipped);
* the plan is :func:`~torchdoctor.treat.ranked_plan.ranked_plan` (the data-parallel trials, and
  the one-process ones that stay valid on a DDP/FSDP2 model).

A ranked re-run is not file-guarded (the harness's file guard is one process's): the script's
writes in the trial runs (checkpoints) are not put back (docs/treat.md "On N ranks").
"""

from __future__ import annotations

from typing import Any

from torchdoctor.treat.session import TreatSession
from torchdoctor.trials import Trials


class RankedTreatSession(TreatSession):
    def __init__(self, target: str, args: list[str], options: Any, **kw: Any):
        from torchdoctor.pipeline.options import RunOptions

        super().__init__(target, args, options, **kw)
        self.nproc = int(RunOptions.of(options).nproc_per_node or 0)

    def _judge_baseline(self, trials: Trials, base0, shown: str):
        from torchdoctor.distributed.ranked import judge

        return judge("checkup", shown, base0.run_dir, self.nproc)

    def _plan(self, survey: dict[str, Any], codes: set[str], **kw: Any):
        from torchdoctor.treat.ranked_plan import ranked_plan

        return ranked_plan(survey, codes, nproc=self.nproc, **kw)

    def _finish(self, report, entries: list[dict], p, survey: dict[str, Any]) -> None:
        super()._finish(report, entries, p, survey)
        report.metrics["treat"]["ranks"] = self.nproc
        report.metrics["treat"]["wrapping"] = _wrapping(survey)

    def _empty_report(self, trials: Trials):
        report = super()._empty_report(trials)
        report.metrics["treat"]["ranks"] = self.nproc
        return report


def _wrapping(survey: dict[str, Any]) -> list[str]:
    from torchdoctor.treat.ranked_plan import wrappings

    return wrappings(survey)
