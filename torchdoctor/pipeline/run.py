"""``run_probe``: run a script once under a probe's instruments and judge the evidence.

Flow: make the run dir (a temp dir, or ``--out DIR`` → ``DIR/run``) → launch the child
harness (``runner.launch``) → load :class:`Evidence` → :func:`judging.judge_run` (rules,
follow-up runs, metrics) → :class:`Report`. Under ``--nproc-per-node`` :func:`run_ranked` launches
through torchrun and ``distributed/ranked.py`` judges each rank with the same pipeline. The parent
never imports torch here: the header (torch version, device) comes from the child's evidence.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from torchdoctor.errors import DoctorError
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.pipeline.judging import judge_run
from torchdoctor.pipeline.options import RunOptions
from torchdoctor.runner.childio import QUIET_PATTERNS
from torchdoctor.runner.outdir import new_run_dir
from torchdoctor.runner.rundir import EVENTS, META, RESULT, STACKS

RUN_FILES = (META, EVENTS, RESULT, STACKS)


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


def run_probe(probe: str, target: str, script_args: list[str],
              options: RunOptions | Mapping[str, Any] | None = None) -> Report:
    """Run ``target`` (a script path, or a module with ``options.module``) under ``probe``.

    ``options``: the :class:`RunOptions` the command built (a plain mapping is read by name:
    :meth:`RunOptions.of`). Returns the Report (not yet printed).
    """
    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.launch import launch

    opts = RunOptions.of(options).resolved()
    module = opts.module
    check_target(target, module)
    timeout = float(opts.timeout) if opts.timeout else None
    argv = [target, *script_args]
    show = None if not opts.quiet else False
    tmp_dirs: list[Path] = []

    first_probe = probe

    def _launch(run_opts: RunOptions, d: Path, under: str = probe) -> Evidence:
        launch(d, under, argv, module=module, options=run_opts, timeout=timeout,
               quiet_patterns=QUIET_PATTERNS, show_progress=show, needs=armed_needs(under))
        return Evidence.load(d)

    if opts.nproc_per_node:  # torchrun: the harness on every rank, one merged report
        return run_ranked(probe, target, argv, opts)
    run_dir, is_tmp = new_run_dir(opts.out)
    if is_tmp:
        tmp_dirs.append(run_dir)
    try:
        from torchdoctor.runner.signals import Stopped

        try:
            ev = _launch(opts, run_dir)
        except Stopped as e:  # a stop signal before the script started: nothing ran
            from torchdoctor.findings import Report

            report = Report(probe, target=opts.label(target), run_status="interrupted")
            report.skip("run", f"interrupted by {e.signame} before the script started")
            return report

        n = [0]

        def relaunch(extra: dict[str, Any], probe: str | None = None) -> Evidence:
            """The same script and arguments again, under ``probe`` (default: this run's)."""
            n[0] += 1
            if opts.out:
                from torchdoctor.runner.outdir import fresh_subdir

                d = fresh_subdir(opts.out, f"followup-{n[0]}")
            else:
                d = Path(tempfile.mkdtemp(prefix="torchdoctor-followup-"))
                tmp_dirs.append(d)
            # a re-run: what it writes is put back afterwards (runner/fileguard.py)
            again = opts.with_options({**extra, "followup": n[0], "guard_files": True})
            return _launch(again, d, probe or first_probe)

        report = judge_run(probe, ev, target=opts.label(target), relaunch=relaunch)
        return report
    finally:
        if not os.environ.get("TORCHDOCTOR_KEEP_RUN"):
            for d in tmp_dirs:
                shutil.rmtree(d, ignore_errors=True)


def run_ranked(probe: str, target: str, argv: list[str], options: RunOptions) -> Report:
    """A script probe on ``options.nproc_per_node`` ranks under torchrun (one node of a
    multi-node job with ``options.node``): launch, then :mod:`torchdoctor.distributed.ranked`
    merges the ranks (or :mod:`torchdoctor.distributed.jobreport` the nodes)."""
    from torchdoctor.distributed.ranked import judge
    from torchdoctor.distributed.torchrun import RankSet, quiet_patterns
    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.launch import launch

    opts = options.resolved()
    n = int(opts.nproc_per_node)
    node = opts.node_spec()  # one node of a multi-node job, or None
    timeout = float(opts.timeout) if opts.timeout else None
    show = None if not opts.quiet else False
    run_dir, is_tmp = new_run_dir(opts.out)  # fresh: no rank dir of an earlier run
    if node is not None:  # the node's facts need torch here: import it while the ranks run
        from torchdoctor.distributed.jobreport import preload

        preload()
    try:
        launch(run_dir, probe, argv, module=opts.module, options=opts, timeout=timeout,
               quiet_patterns=QUIET_PATTERNS + quiet_patterns(dict(os.environ)), show_progress=show,
               ranks=RankSet(run_dir, n, node=node), needs=armed_needs(probe))
        label = opts.label(target)
        if node is not None:
            from torchdoctor.distributed.jobreport import run_node

            return run_node(probe, label, run_dir, n, node)
        return judge(probe, label, run_dir, n)
    finally:
        if is_tmp and not os.environ.get("TORCHDOCTOR_KEEP_RUN"):
            shutil.rmtree(run_dir, ignore_errors=True)
