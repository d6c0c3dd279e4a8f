"""``run_probe``: run a script once under a probe's instruments and judge the evidence.

Flow: make the run dir (a temp dir, or ``--out DIR`` → ``DIR/run``) → launch the child
harness (``runner.launch``) → load :class:`Evidence` → rules of the run itself (probe
``"run"``: crash, hang, signal, no steps) and of the probe → follow-up runs for findings that
need one → metrics providers → :class:`Report`. The parent never imports torch here: the
header (torch version, device) comes from the child's evidence.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import re
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from torchdoctor.errors import DoctorError
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, Report, internal_finding
from torchdoctor.runner.rundir import EVENTS, META, RESULT, STACKS

RUN_FILES = (META, EVENTS, RESULT, STACKS)
DEFAULT_STEPS = 50
DEFAULT_TIMEOUT_S = 300.0
# output lines of libraries that are not the script's (Kineto's profiler start/stop notes)
QUIET_PATTERNS: list[str] = [r"^STAGE:\d{4}-\d\d-\d\d .*ActivityProfilerController\.cpp"]


def check_target(target: str, module: bool) -> None:
    """Bad input → DoctorError (exit 2) before anything is launched."""
    if module:
        top = target.split(".")[0]
        if not top.isidentifier():
            raise DoctorError(f"not a module name: {target!r}")
        spec = find_top_module(top)
        if spec is None:
            raise DoctorError(f"module not found: {top!r}",
                              hint="run from the folder that holds the package, or pass SCRIPT")
        return
    p = Path(target)
    if not p.exists():
        raise DoctorError(f"script not found: {target}")
    if p.is_dir():
        if (p / "__main__.py").is_file():
            return
        raise DoctorError(f"{target} is a folder, not a script",
                          hint="pass the training script's .py file, or -m PACKAGE.MODULE")
    if not os.access(p, os.R_OK):
        raise DoctorError(f"cannot read {target}")


def find_top_module(top: str):
    """The spec of top-level module ``top`` as ``python -m`` would find it: the current folder
    first on the path (the ``torchdoctor`` entry point's own path does not hold it). Imports
    nothing of the user's."""
    import sys

    saved = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved


def _run_dir(out: str | None) -> tuple[Path, bool]:
    """(run dir, is_temporary). Under --out (a folder torchdoctor owns, see runner.outdir) the
    run dir ``run`` of an earlier run there is replaced."""
    if out:
        from torchdoctor.runner.outdir import fresh_subdir

        return fresh_subdir(out, "run"), False
    return Path(tempfile.mkdtemp(prefix="torchdoctor-run-")), True


def _context(ev: Evidence) -> dict[str, Any]:
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


def _internal(title: str, evidence: dict[str, Any]) -> Finding:
    return internal_finding(title, evidence)


def _instrument_errors(ev: Evidence, report: Report) -> None:
    for e in ev.of("instrument_error"):
        report.add(_internal(f"instrument {e.get('instrument')} failed in {e.get('callback')}",
                             {"instrument": e.get("instrument"), "callback": e.get("callback"),
                              "traceback": e.get("traceback", "")}))


def _metrics(ev: Evidence, report: Report) -> None:
    from torchdoctor.pipeline.registry import metrics_providers

    for name, fn in sorted(metrics_providers().items()):
        try:
            value = fn(ev)
        except Exception as e:  # noqa: BLE001
            report.add(_internal(f"metrics {name} failed: {type(e).__name__}: {e}",
                                 {"provider": name, "traceback": traceback.format_exc(limit=6)}))
            continue
        if value is not None:
            report.metrics[name] = value


def _followups(report: Report, ev: Evidence, relaunch) -> None:
    """Run the follow-ups of the report's findings. Each re-run is timed and listed in
    ``report.metrics["followups"]`` ({for, by, probe, seconds, outcome, steps}). A follow-up's
    result is merged into its finding's evidence; the keys ``_skill`` (re-route the skill) and
    ``_replace`` (a Finding that takes the place of the original, e.g. a replay that located
    the value more precisely) are directives, not evidence."""
    from torchdoctor.pipeline.followups import followups_for

    runs: list[dict[str, Any]] = []
    for i, f in enumerate(list(report.findings)):
        for fn in followups_for(f.code):
            timed = _timed_relaunch(relaunch, runs, f.code, fn.__name__, ev.meta.get("probe"))
            try:
                extra = fn(ev, timed) or {}
            except Exception as e:  # noqa: BLE001
                report.add(_internal(f"follow-up {fn.__name__} for {f.code} failed: "
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


def _timed_relaunch(relaunch, runs: list[dict[str, Any]], code: str, name: str,
                    this_probe: str | None):
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


STEP_LIMIT_REASON = re.compile(r"--steps (\d+) reached")  # runner/core.py's stop reason


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


def _step_limit(ev: Evidence, report: Report) -> None:
    """``metrics.run.stopped_by = "steps"`` (and ``step_limit``, ``step_limit_default``) when
    the ``--steps`` limit cut the run; the console says it under the step table."""
    n = step_limit_cut(ev)
    if n is None:
        return
    run = report.metrics.setdefault("run", {})
    run["stopped_by"] = "steps"
    run["step_limit"] = n
    run["step_limit_default"] = n == DEFAULT_STEPS


def run_status(outcome: str | None) -> str | None:
    """Report status forced by how the run ended (None: derived from the findings)."""
    if outcome in ("crash", "signal"):
        return "crashed"
    if outcome == "timeout":
        return "timeout"
    if outcome == "interrupted":
        return "interrupted"
    return None


def run_probe(probe: str, target: str, script_args: list[str], options: dict[str, Any]) -> Report:
    """Run ``target`` (a script path, or a module with ``options['module']``) under ``probe``.

    ``options``: ``steps`` (int, 0 = no limit), ``timeout`` (seconds), ``out`` (dir or None),
    ``module`` (bool), ``quiet`` (no progress line), plus probe-specific keys that instruments
    read from ``ctx.options``. Returns the Report (not yet printed).
    """
    from torchdoctor.judge import judge
    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.launch import launch

    module = bool(options.get("module"))
    check_target(target, module)
    opts = {k: v for k, v in options.items() if k not in ("module", "quiet")}
    opts.setdefault("steps", DEFAULT_STEPS)
    opts.setdefault("timeout", DEFAULT_TIMEOUT_S)
    if opts.get("out"):
        opts["out"] = str(Path(opts["out"]).resolve())
    timeout = float(opts["timeout"]) if opts.get("timeout") else None
    argv = [target, *script_args]
    show = None if not options.get("quiet") else False
    tmp_dirs: list[Path] = []

    first_probe = probe

    def _launch(run_opts: dict[str, Any], d: Path, under: str = probe) -> Evidence:
        launch(d, under, argv, module=module, options=run_opts, timeout=timeout,
               quiet_patterns=QUIET_PATTERNS, show_progress=show, needs=armed_needs(under))
        return Evidence.load(d)

    if opts.get("nproc_per_node"):  # torchrun: the harness on every rank, one merged report
        from torchdoctor.distributed.ranked import run_ranked

        return run_ranked(probe, target, argv, module=module, opts=opts, timeout=timeout, show=show)
    run_dir, is_tmp = _run_dir(opts.get("out"))
    if is_tmp:
        tmp_dirs.append(run_dir)
    try:
        ev = _launch(opts, run_dir)
        report = Report(command=probe, target=" ".join(["-m", target] if module else [target]))
        report.context = _context(ev)

        n = [0]

        def relaunch(extra: dict[str, Any], probe: str | None = None) -> Evidence:
            """The same script and arguments again, under ``probe`` (default: this run's)."""
            n[0] += 1
            if opts.get("out"):
                from torchdoctor.runner.outdir import fresh_subdir

                d = fresh_subdir(opts["out"], f"followup-{n[0]}")
            else:
                d = Path(tempfile.mkdtemp(prefix="torchdoctor-followup-"))
                tmp_dirs.append(d)
            return _launch({**opts, **extra, "followup": n[0]}, d, probe or first_probe)

        judge("run", ev, report)
        if probe != "run":
            judge(probe, ev, report)
        if ev.result.get("outcome") != "interrupted":  # stopped by the user: no re-run
            _followups(report, ev, relaunch)
        _instrument_errors(ev, report)
        _metrics(ev, report)
        _step_limit(ev, report)
        for a in ev.of("artifact"):
            if a.get("name") and a.get("path"):
                report.artifacts[str(a["name"])] = str(a["path"])
        report.run_status = run_status(ev.result.get("outcome"))
        return report
    finally:
        if not os.environ.get("TORCHDOCTOR_KEEP_RUN"):
            for d in tmp_dirs:
                shutil.rmtree(d, ignore_errors=True)
