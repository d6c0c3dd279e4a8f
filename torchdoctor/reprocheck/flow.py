"""The ``repro`` orchestration: two runs, then (only when they differ) a localising pair and,
for a nondeterministic op, a deterministic pair; then the evidence, the rules, the report.

1. **pair**: the script twice under the trials layer, same argv and environment, bounded by
   ``--steps``; nothing is seeded for the user. Compared step by step (:mod:`.steps`).
2. **localise** (only when the pair diverged, at step S): the script twice more, to step S,
   with the op trace of step S (:mod:`.ops`), and the RNG traces of the first pair compared up to
   S (:mod:`.rng`).
3. **deterministic** (only when the first differing op gave two outputs for equal inputs): one
   more bounded pair with ``torch.use_deterministic_algorithms(True)``,
   ``cudnn.benchmark = False`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set in the child: is it
   reproducible then, and what does it cost per step (median step time vs the first pair's).

The localising and deterministic pairs are runs the user did not ask for (stopped early, other
kernels): the files run A wrote next to its checkpoints are kept aside before them and put back
after (``guard.py``).

The comparison becomes one ``repro_compare`` event, judged by ``rules/repro_runs.py`` (probe
``repro``); the same dict is the report's ``metrics.repro`` section. Run A's own evidence is
judged as a plain run too (a crash or a hang is reported as by ``checkup``).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.pipeline.options import RunOptions
from torchdoctor.reprocheck.guard import OwnFiles
from torchdoctor.trials import TrialRun, Trials, Variation

REPRO_NEEDS = frozenset({"fingerprint", "rng_trace", "op_trace", "repro_mode"})
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
DETERMINISTIC_SETTING = ("torch.use_deterministic_algorithms(True), torch.backends.cudnn.benchmark"
                         " = False, CUBLAS_WORKSPACE_CONFIG=:4096:8")
LOSS_ROWS = 200  # losses kept per run in the JSON section

RUN_A = Variation("run-a", "the script as it is", needs=REPRO_NEEDS)
RUN_B = Variation("run-b", "the same script again", needs=REPRO_NEEDS)


def localise_variation(step: int, engine: str) -> Variation:
    return Variation("localise", f"op trace of step {step}",
                     options={"repro_ops": {"step": step, "engine": engine}}, needs=REPRO_NEEDS)


DETERMINISTIC = Variation("deterministic", DETERMINISTIC_SETTING,
                          options={"repro_deterministic": True}, env=dict(DETERMINISTIC_ENV),
                          needs=REPRO_NEEDS)


def compare_pair(a: TrialRun, b: TrialRun) -> tuple[dict[str, Any] | None, int]:
    from torchdoctor.reprocheck.steps import by_step, first_divergence

    return first_divergence(by_step(a.evidence.of("fingerprint")), by_step(b.evidence.of("fingerprint")),
                            a.losses(), b.losses())


def _run_facts(r: TrialRun) -> dict[str, Any]:
    ms = r.median_ms()
    return {"name": r.variation.name, "wall_s": round(r.wall_s, 2), "steps": len(r.losses()),
            "median_step_ms": round(ms, 3) if ms is not None else None, "failure": r.failure()}


def measure(trials: Trials, engine: str = "auto", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the pairs and return the ``repro_compare`` data (also the JSON section), built in
    ``out`` as the runs go (a stop signal's :class:`~torchdoctor.runner.signals.Stopped` leaves
    there what was measured: :func:`interrupted`)."""
    from torchdoctor.reprocheck.ops import first_divergent_op, trace_summary
    from torchdoctor.reprocheck.rng import compare_generators, draw_counts
    from torchdoctor.reprocheck.steps import describe

    out = {} if out is None else out
    a = trials.run(RUN_A, round=0)
    b = trials.run(RUN_B, round=1)
    out.update({"tolerance": "bitwise", "runs": [_run_facts(a), _run_facts(b)],
                "losses": {"a": a.losses()[:LOSS_ROWS], "b": b.losses()[:LOSS_ROWS]}})
    ra, rb = a.evidence.last("rng_trace"), b.evidence.last("rng_trace")
    out["draws"] = {"a": draw_counts(ra), "b": draw_counts(rb)}
    failed = a.failure() or b.failure()
    if failed:
        out.update(compared=False, identical=None, steps_compared=0,
                   reason=f"run {'A' if a.failure() else 'B'} did not train: {failed}")
        return out
    div, n = compare_pair(a, b)
    out.update(compared=True, steps_compared=n, identical=div is None,
               first_divergent_step=div["step"] if div else None,
               diverged=({**div, "description": describe(div)} if div else None))
    info = [r.evidence.last("fingerprint_info") or {} for r in (a, b)]
    out["fingerprint"] = {"tensors_per_run": [i.get("tensors") for i in info],
                          "truncated": any(i.get("truncated") for i in info)}
    if div is None:
        return out
    step = int(div["step"])
    implicated, ruled = compare_generators(ra, rb, step)
    out["generators"] = {"implicated": implicated, "ruled_out": ruled}
    if trials.expired():
        out["first_divergent_op"] = {"kind": "unavailable", "reason": "the time budget ran out"}
        return out
    own = OwnFiles(a)  # the altered runs write the script's files again: put back after
    if not own.keep():
        out["first_divergent_op"] = {"kind": "unavailable", "reason": own.refused}
        return out
    try:
        la = trials.run(localise_variation(step, engine), round=0, steps=step)
        lb = trials.run(localise_variation(step, engine), round=1, steps=step)
        ta, tb = la.evidence.last("op_trace"), lb.evidence.last("op_trace")
        op = first_divergent_op(ta, tb)
        if op and op.get("kind") == "nondeterministic" and not trials.expired():
            out["deterministic"] = _deterministic(trials, a, b)
    finally:
        own.restore()
    if op is None:
        op = {"kind": "not-reproduced",
              "reason": f"the op traces of step {step} agreed in the localising pair"}
    out["first_divergent_op"] = op
    out["op_trace"] = trace_summary(ta)
    return out


def _deterministic(trials: Trials, a: TrialRun, b: TrialRun) -> dict[str, Any]:
    from torchdoctor.trials.compare import median

    da = trials.run(DETERMINISTIC, round=0)
    db = trials.run(DETERMINISTIC, round=1)
    res: dict[str, Any] = {"setting": DETERMINISTIC_SETTING,
                           "runs": [_run_facts(da), _run_facts(db)]}
    failed = da.failure() or db.failure()
    if failed:
        res.update(reproducible=None, failure=failed)
        return res
    div, n = compare_pair(da, db)
    base = median([m for m in (a.median_ms(), b.median_ms()) if m is not None])
    det = median([m for m in (da.median_ms(), db.median_ms()) if m is not None])
    res.update(reproducible=div is None, steps_compared=n,
               first_divergent_step=div["step"] if div else None,
               baseline_median_step_ms=round(base, 3) if base else None,
               median_step_ms=round(det, 3) if det else None,
               cost=round(det / base, 3) if base and det else None)
    mode = da.evidence.last("repro_mode") or {}
    res["held_at_end"] = {k: mode.get(k) for k in ("deterministic_at_end", "cudnn_benchmark_at_end")}
    return res


def interrupted(data: dict[str, Any], signame: str) -> None:
    """What a stop signal left unmeasured in ``data`` (:func:`measure`'s), said as such."""
    why = f"interrupted by {signame}"
    if not data.get("compared"):
        data.update(tolerance="bitwise", compared=False, identical=None, steps_compared=0,
                    reason=f"{why} before both runs finished")
    elif data.get("diverged") and "first_divergent_op" not in data:
        data["first_divergent_op"] = {"kind": "unavailable", "reason": why}
    data["interrupted"] = signame


def repro_report(target: str, script_args: list[str], options: RunOptions | dict[str, Any],
                 engine: str = "auto", resume: bool = False) -> Report:
    """Run ``repro`` on ``target`` and return its Report (not yet printed). ``resume``: then the
    resume check (``reprocheck/resume.py``) on the same Trials session: the state the script's
    own checkpoint lacks is reset after its save in one more run each, and what differs is
    measured; its findings replace the save audit's for the same code and save line."""
    from torchdoctor.judge import judge
    from torchdoctor.pipeline.judging import judge_run

    run_opts = RunOptions.of(options)
    if run_opts.nproc_per_node:  # N ranks: the resume check only (reprocheck/resume_ranked.py)
        from torchdoctor.reprocheck.resume_ranked import ranked_report

        return ranked_report(target, script_args, run_opts)
    label = run_opts.label(target)
    from torchdoctor.runner.signals import Stopped

    with Trials("repro", target, script_args, options=options) as trials:
        data: dict[str, Any] = {}
        try:
            measure(trials, engine=engine, out=data)
        except Stopped as e:  # a stop signal between runs: no further run, report what ran
            interrupted(data, e.signame)
        if not trials.runs:  # stopped before run A started
            report = Report("repro", target=label, run_status="interrupted")
            report.skip("repro", data["reason"])
            report.metrics["repro"] = data
            return report
        first = trials.runs[0]
        failed = next((r for r in trials.runs[:2] if r.failure()), None)
        run_ev = (failed or first).evidence
        report = judge_run("run", run_ev, target=label)
        resumed = None
        if resume and not trials.interrupted():
            from torchdoctor.reprocheck.resume import resume_check

            try:
                resumed = resume_check(trials)
            except Stopped as e:
                report.skip("resume-check", f"interrupted by {e.signame}")
        elif resume:
            report.skip("resume-check", f"interrupted by {trials.interrupted()}")
        if trials.interrupted():  # inside a run (the launcher noted it) or between two
            interrupted(data, trials.interrupted())
            report.run_status = "interrupted"
    report.command = "repro"
    # the repro rules read the comparison; the save audit (rules/checkpoint_saves.py) reads run
    # A's saves: one evidence holds both
    events = list(run_ev.events)
    if data.get("compared"):
        events.append({"kind": "repro_compare", **data})
    judge("repro", Evidence(meta=run_ev.meta, events=events, result=run_ev.result), report)
    if not data.get("compared"):
        report.skip("repro", data.get("reason") or "the runs could not be compared")
    if resumed is not None:
        from torchdoctor.reprocheck.resume import supersede

        measured, section = resumed
        report.findings = supersede(report.findings, measured)
        report.metrics["resume"] = section
    report.metrics["repro"] = data
    return report
