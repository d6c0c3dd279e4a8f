"""Judging a finished script run: the one pipeline from Evidence to Report.

Stages, in order (each guarded: a failing stage is an ``internal-error`` finding, the rest of
the report stands):

1. rules of the run itself (probe ``run``: crash, hang, signal, no steps) and of the probe;
2. follow-up runs for findings that need one (``followups.py``), when a ``relaunch`` is given;
3. instrument failures reported by the child (``instrument_error`` events);
4. metrics providers (``registry.py``);
5. the ``--steps`` cut, artifacts, and the status forced by how the run ended.

:func:`judge_run` is used by a single run (``run.py``), by each rank of a torchrun run
(``distributed/ranked.py``, which merges the rank reports) and by the in-process tests. A ranked
run has no ``relaunch``: its follow-ups are listed as skipped, with the reason, not dropped.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback
from typing import Any, Callable

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report, internal_finding
from torchdoctor.pipeline.options import DEFAULT_STEPS

STEP_LIMIT_REASON = re.compile(r"--steps (\d+) reached")  # runner's stop reason
Relaunch = Callable[..., Evidence]  # (extra_options, probe=None) -> Evidence


def judge_run(probe: str, ev: Evidence, *, target: str | None = None,
              relaunch: Relaunch | None = None, metrics: bool = True) -> Report:
    """The report of one run's evidence under ``probe``. Without ``relaunch`` the follow-ups
    of the findings are listed in ``skipped``; ``metrics=False`` leaves the metrics out (the
    ranks of a torchrun run: the merged report takes rank 0's)."""
    from torchdoctor.judge import judge

    report = Report(command=probe, target=target)
    report.context = context_of(ev)
    judge("run", ev, report)
    if probe != "run":
        judge(probe, ev, report)
    if ev.result.get("outcome") != "interrupted":  # stopped by the user: no re-run
        followups(report, ev, relaunch)
    instrument_errors(ev, report)
    if metrics:
        add_metrics(ev, report)
        step_limit(ev, report)
    for a in ev.of("artifact"):
        if a.get("name") and a.get("path"):
            report.artifacts[str(a["name"])] = str(a["path"])
    report.run_status = run_status(ev.result.get("outcome"))
    return report


def context_of(ev: Evidence) -> dict[str, Any]:
    """The report header (python, torch, device) from the child's evidence."""
    import platform

    env = ev.last("env") or {}
    dev = ev.last("device") or {}
    ctx: dict[str, Any] = {"python": env.get("python") or platform.python_version()}
    if env.get("torch"):
        ctx["torch"] = env["torch"]
    if dev.get("device", "").startswith("cuda"):
        ctx["device"] = f"{dev['device']} ({dev.get('name')})"
    elif dev:
        ctx["device"] = "cpu"
    return ctx


def instrument_errors(ev: Evidence, report: Report) -> None:
    for e in ev.of("instrument_error"):
        report.add(internal_finding(
            f"instrument {e.get('instrument')} failed in {e.get('callback')}",
            {"instrument": e.get("instrument"), "callback": e.get("callback"),
             "traceback": e.get("traceback", "")}))


def add_metrics(ev: Evidence, report: Report) -> None:
    from torchdoctor.pipeline.registry import metrics_providers

    for name, fn in sorted(metrics_providers().items()):
        try:
            value = fn(ev)
        except Exception as e:  # noqa: BLE001
            report.add(internal_finding(f"metrics {name} failed: {type(e).__name__}: {e}",
                                        {"provider": name,
                                         "traceback": traceback.format_exc(limit=6)}))
            continue
        if value is not None:
            report.metrics[name] = value


def followups(report: Report, ev: Evidence, relaunch: Relaunch | None) -> None:
    """Run the follow-ups of the report's findings. Each re-run is timed and listed in
    ``report.metrics["followups"]`` ({for, by, probe, seconds, outcome, steps}). A follow-up's
    result is merged into its finding's evidence; the keys ``_skill`` (re-route the skill) and
    ``_replace`` (a Finding that takes the place of the original, e.g. a replay that located
    the value more precisely) are directives, not evidence."""
    from torchdoctor.pipeline.followups import followups_for
    from torchdoctor.runner.signals import Stopped, stopped

    runs: list[dict[str, Any]] = []
    for i, f in enumerate(list(report.findings)):
        for fn in followups_for(f.code):
            if relaunch is None:
                report.skip(f"followup:{fn.__name__}",
                            f"{f.code}: not re-run under torchrun; run the script alone "
                            "(without --nproc-per-node) to get it")
                continue
            if stopped():
                report.skip(f"followup:{fn.__name__}", f"{f.code}: not re-run: interrupted by {stopped()}")
                continue
            timed = _timed_relaunch(relaunch, runs, f.code, fn.__name__, ev.meta.get("probe"))
            try:
                extra = fn(ev, timed) or {}
            except Stopped as e:  # the signal came between two re-runs of one follow-up
                report.skip(f"followup:{fn.__name__}", f"{f.code}: not re-run: interrupted by {e.signame}")
                continue
            except Exception as e:  # noqa: BLE001
                report.add(internal_finding(f"follow-up {fn.__name__} for {f.code} failed: "
                                            f"{type(e).__name__}: {e}",
                                            {"followup": fn.__name__,
                                             "traceback": traceback.format_exc(limit=6)}))
                continue
            if extra:
                replace = extra.pop("_replace", None)
                skill = extra.pop("_skill", None)  # a follow-up may re-route the finding's skill
                if replace is not None:
                    f = replace
                f = dataclasses.replace(f, evidence={**f.evidence, **extra}, skill=skill or f.skill)
                report.findings[i] = f
    if runs:
        report.metrics["followups"] = runs


def _timed_relaunch(relaunch: Relaunch, runs: list[dict[str, Any]], code: str, name: str,
                    this_probe: str | None) -> Relaunch:
    """``relaunch`` that records what each re-run cost."""

    def timed(extra: dict[str, Any], probe: str | None = None) -> Evidence:
        t0 = time.perf_counter()
        ev2 = relaunch(extra, probe=probe) if probe else relaunch(extra)
        res = getattr(ev2, "result", None) or {}
        runs.append({"for": code, "by": name, "probe": probe or this_probe,
                     "seconds": round(time.perf_counter() - t0, 3),
                     "outcome": res.get("outcome"), "steps": res.get("steps")})
        return ev2

    return timed


def step_limit_cut(ev: Evidence) -> int | None:
    """N when the run was ended by the ``--steps N`` limit (not by the script, an instrument's
    stop, a crash or the timeout); else None."""
    res = ev.result or {}
    if res.get("outcome") != "stopped":
        return None
    m = STEP_LIMIT_REASON.fullmatch(str(res.get("reason") or ""))
    if not m:
        return None
    return int(m.group(1))


def step_limit(ev: Evidence, report: Report) -> None:
    """``metrics.run.stopped_by = "steps"`` (and ``step_limit``, ``step_limit_default``) when
    the ``--steps`` limit cut the run; the console says it under the step table."""
    n = step_limit_cut(ev)
    if n is None:
        return
    run = report.metrics.setdefault("run", {})
    run["stopped_by"] = "steps"
    run["step_limit"] = n
    run["step_limit_default"] = n == int(ev.options.get("steps_default", DEFAULT_STEPS))


def run_status(outcome: str | None) -> str | None:
    """Report status forced by how the run ended (None: derived from the findings)."""
    if outcome in ("crash", "signal"):
        return "crashed"
    if outcome == "timeout":
        return "timeout"
    if outcome == "interrupted":
        return "interrupted"
    return None
