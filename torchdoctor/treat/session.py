"""The ``treat`` schedule (parent): baseline, then trials alternating with baseline rounds.

1. **Baseline** under the checkup instruments (plus the survey): judged as ``checkup`` judges
   it (its findings, follow-ups and metrics are the report's);
2. **plan** (:mod:`.plan`) from its findings, survey and device, or ``--try``;
3. **rounds**: ``B T1 T2 … Tk``, then ``B Tk … T1`` (the order reversed every other round, so
   that a slow drift of the machine does not favour one trial), ``--rounds`` times (≥ 2); a
   trial that failed is not run again;
4. **combined**: the adopted trials that combine (:func:`.plan.combination`), as one more trial
   ``C B C`` — alternating with one more baseline round;
5. the entries (:mod:`.measure`), the findings that an adopted trial confirmed get
   ``treat: {name: ratio}`` in their evidence.

Bounds: ``--budget`` for the whole command (no run starts when less than one baseline run's
wall is left; a run gets at most the time left), ``--timeout`` per run. Ctrl-C, SIGTERM, SIGHUP:
the runner forwards SIGINT to the child; the interrupted run is dropped, no further run starts
(also when the signal came between two runs: the command's ``deferred`` scope records it) and
the report of what ran is printed (status ``interrupted``). One progress line per run on stderr.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from torchdoctor.treat.catalogue import BY_NAME
from torchdoctor.treat.measure import RUN_NEEDS, skipped_entry, trial_entry
from torchdoctor.treat.plan import Planned, combination, default_workers, plan, tolerance_for
from torchdoctor.trials import Trials, Variation

BASE = Variation("baseline", "the script as it is", options={"treatment": []}, needs=RUN_NEEDS)


class Stop(Exception):
    """No further run: the budget is spent or the user interrupted."""


def setting_of(p: Planned, survey: dict[str, Any]) -> str:
    if p.name == "dataloader-workers":
        n = int(p.value) if p.value else default_workers(survey.get("cpus"))
        return f"num_workers={n}, persistent_workers=True, prefetch_factor=2"
    if p.name in ("compile", "compile-blocks"):
        what = "model" if p.name == "compile" else "each fully_shard block"
        return f"{what}.compile({'' if not p.value or p.value == 'default' else p.value})"
    if p.name == "ddp-bucket-cap":
        from torchdoctor.treat.ranked_plan import bucket_target

        return f"DistributedDataParallel(bucket_cap_mb={bucket_target(survey, p.value):g})"
    return BY_NAME[p.name].changes


def variation_of(specs: list[Planned], setting: str, name: str | None = None) -> Variation:
    import os

    from torchdoctor.treat.backend import ALLOC_ENV, with_expandable

    env = {}
    if any(p.name == "expandable-segments" for p in specs):
        env[ALLOC_ENV] = with_expandable(os.environ.get(ALLOC_ENV, ""))
    return Variation(name or specs[0].name, setting,
                     options={"treatment": [{"name": p.name, "value": p.value} for p in specs]},
                     env=env, needs=RUN_NEEDS)


class TreatSession:
    def __init__(self, target: str, args: list[str], options: Any, *,  # RunOptions (trials)
                 budget_s: float | None, forced: list[tuple[str, str | None]] | None,
                 rounds: int = 2, progress: Callable[[str], None] = print):
        self.target, self.args, self.options = target, args, options
        self.budget_s, self.forced, self.rounds = budget_s, forced, max(2, rounds)
        self.progress = progress
        self.t0 = time.monotonic()
        self.stopped: str | None = None
        self.runs = 0
        self.run_wall_s = 0.0  # the runs' own walls (launch to exit), summed
        self.est_s = 0.0

    # ---- runs -------------------------------------------------------------------------------
    def _run(self, trials: Trials, v: Variation, rnd: int, label: str, probe: str | None = None):
        from torchdoctor.runner.signals import Stopped, stopped

        if self.stopped:
            raise Stop(self.stopped)
        if stopped():  # a stop signal between two runs (the command's deferred scope)
            self.stopped = "interrupted"
            raise Stop("interrupted")
        left = trials.remaining_s()
        if trials.expired() or (left is not None and self.est_s and left < self.est_s):
            self.stopped = "budget"
            raise Stop("budget")
        t = time.monotonic()
        try:
            r = trials.run(v, round=rnd, probe=probe)
        except (KeyboardInterrupt, Stopped):
            self.stopped = "interrupted"
            raise Stop("interrupted") from None
        self.runs += 1
        self.run_wall_s += r.wall_s
        if r.interrupted():
            self.stopped = "interrupted"
            trials.runs.remove(r)
            raise Stop("interrupted")
        ms = r.median_ms()
        slow = r.slowest_rank() if hasattr(r, "slowest_rank") else None  # a ranked run
        what = r.failure() or (f"{ms:.4g} ms/step" + (f" (slowest: rank {slow})" if slow is not None else "")
                               if ms is not None else "no step")
        self.progress(f"torchdoctor treat: {label}: {what} ({time.monotonic() - t:.1f} s)")
        return r

    # ---- the whole command ----------------------------------------------------------------------
    def run(self):
        with Trials("checkup", self.target, self.args, options=self.options,
                    budget_s=self.budget_s) as trials:
            try:
                base0 = self._run(trials, BASE, 0, "baseline (round 1)")
            except Stop:
                base0 = None
            if base0 is None:
                return self._empty_report(trials)
            self.est_s = base0.wall_s

            shown = " ".join(["-m", self.target] if trials.module else [self.target])
            try:
                report = self._judge_baseline(trials, base0, shown)
            except KeyboardInterrupt:  # Ctrl-C while judging: the baseline's report without it
                self.stopped = "interrupted"
                return self._empty_report(trials)
            report.command = "treat"
            from torchdoctor.runner.signals import stopped

            if any(r.interrupted() for r in trials.runs) or stopped():  # in a follow-up, or judging
                self.stopped = "interrupted"
            survey = base0.evidence.last("treat_survey") or {}
            codes = {f.code for f in report.findings}
            on_cuda = str((base0.evidence.last("device") or {}).get("device", "")).startswith("cuda")
            oom = "out-of-memory" in codes
            peaks = {"allocated": base0.peak_memory()[0] if on_cuda else None,
                     "reserved": base0.peak_reserved()}
            p = self._plan(survey, codes, on_cuda=on_cuda, forced=self.forced,
                           baseline_failure=base0.failure(), baseline_oom=oom, peaks=peaks)
            entries = self._schedule(trials, base0, p, survey, oom)
        self._finish(report, entries, p, survey)
        return report

    def _judge_baseline(self, trials: Trials, base0, shown: str):
        """The baseline judged as ``checkup`` judges one run (follow-ups relaunched)."""
        from torchdoctor.pipeline.judging import judge_run

        def relaunch(extra: dict[str, Any], probe: str | None = None):
            v = dataclasses.replace(BASE, name="followup", options={**BASE.options, **extra})
            return trials.run(v, probe=probe).evidence

        return judge_run("checkup", base0.evidence, target=shown, relaunch=relaunch)

    def _plan(self, survey: dict[str, Any], codes: set[str], **kw: Any):
        return plan(survey, codes, **kw)

    def _schedule(self, trials: Trials, base0, p, survey: dict[str, Any], oom: bool) -> list[dict]:
        bases = [base0]
        runs: dict[str, list] = {t.name: [] for t in p.trials}
        failed: set[str] = set()
        total = self.rounds * (1 + len(p.trials))
        n = 1
        try:
            for rnd in range(self.rounds if p.trials else 0):
                order = p.trials if rnd % 2 == 0 else list(reversed(p.trials))
                if rnd:
                    n += 1
                    bases.append(self._run(trials, BASE, rnd, f"[{n}/{total}] baseline (round {rnd + 1})"))
                for t in order:
                    if t.name in failed:
                        continue
                    n += 1
                    r = self._run(trials, variation_of([t], setting_of(t, survey)), rnd,
                                  f"[{n}/{total}] {t.name} (round {rnd + 1})")
                    runs[t.name].append(r)
                    if r.failure() or r.evidence.of("treatment_error"):
                        failed.add(t.name)
        except Stop:
            pass
        entries = self._entries(bases, p, runs, survey, oom)
        if self.stopped:
            return entries
        combo = combination([e for e in entries if e["verdict"] == "adopt"])
        if combo:
            specs = [next(t for t in p.trials if t.name == e["name"]) for e in combo]
            setting = " + ".join(s.name for s in specs)
            v = variation_of(specs, setting, name="combined")
            c_runs = []
            try:
                c_runs.append(self._run(trials, v, 0, f"combined {setting} (round 1)"))
                bases.append(self._run(trials, BASE, self.rounds, f"baseline (round {self.rounds + 1})"))
                c_runs.append(self._run(trials, v, 1, f"combined {setting} (round 2)"))
            except Stop:
                pass
            if c_runs:
                entries = self._entries(bases, p, runs, survey, oom)
                tol = max(tolerance_for(s.treatment, survey) for s in specs)
                intent = "speed" if any(s.treatment.intent == "speed" for s in specs) else "memory"
                e = trial_entry("combined", setting, bases, c_runs, tolerance=tol, intent=intent,
                                survey=survey, baseline_oom=oom)
                e["combines"] = [s.name for s in specs]
                entries.append(e)
        return entries

    def _entries(self, bases, p, runs, survey, oom) -> list[dict]:
        out = []
        for t in p.trials:
            tr = BY_NAME[t.name]
            if not runs[t.name]:
                out.append(skipped_entry(t.name, "not run: " + (
                    "interrupted (Ctrl-C)" if self.stopped == "interrupted" else "--budget reached"),
                    setting_of(t, survey)))
                continue
            e = trial_entry(t.name, setting_of(t, survey), bases, runs[t.name],
                            tolerance=tolerance_for(tr, survey), intent=tr.intent, survey=survey, baseline_oom=oom)
            e["why"] = t.why
            if t.value is not None:
                e["value"] = t.value
            out.append(e)
        for name, reason in p.skipped:
            out.append(skipped_entry(name, reason))
        return out

    def _finish(self, report, entries: list[dict], p, survey: dict[str, Any]) -> None:
        from torchdoctor.treat.confirm import confirm_findings

        report.metrics["trials"] = entries
        report.metrics["treat"] = {
            "runs": self.runs, "rounds": self.rounds, "wall_s": round(time.monotonic() - self.t0, 3),
            "runs_wall_s": round(self.run_wall_s, 3),
            "budget_s": self.budget_s, "stopped": self.stopped,
            "forced": [n for n, _ in self.forced] if self.forced else None,
            "adopted": [e["name"] for e in entries if e["verdict"] == "adopt"]}
        confirm_findings(report, entries)
        if self.stopped == "interrupted":
            report.run_status = "interrupted"

    def _empty_report(self, trials: Trials):
        from torchdoctor.findings import Report

        report = Report(command="treat", target=self.target)
        report.metrics["trials"] = []
        report.metrics["treat"] = {"runs": self.runs, "rounds": self.rounds, "stopped": self.stopped,
                                   "wall_s": round(time.monotonic() - self.t0, 3),
                                   "budget_s": self.budget_s, "forced": None, "adopted": []}
        if self.stopped == "interrupted":
            report.run_status = "interrupted"
        return report
