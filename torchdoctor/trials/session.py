"""Running trials: one script, many bounded runs under variations, one owner of their dirs.

    with Trials("checkup", "train.py", ["--lr", "3e-4"], options=opts, budget_s=600) as trials:
        base = trials.run(BASELINE, round=0)
        tf32 = trials.run(Variation("tf32", "allow_tf32=True", options={"treatment": ...}))
        base.median_ms(), tf32.losses(), tf32.failure()

Each run has the same argv, module flag, steps and timeout as the command (``options`` as
``run_probe`` takes them), the variation's child options and environment on top, and arms the
probe's instruments plus :data:`TRIAL_NEEDS` plus the variation's needs. The script's output is
not echoed (its tail is kept in the evidence). ``budget_s`` bounds the whole command: a run
gets at most the time left, and :meth:`Trials.expired` says when no run should start.

With ``nproc_per_node = N`` in the options each run is one torchrun launch of N ranks (the ranked
launch of ``distributed/torchrun.py``) and comes back as a
:class:`~torchdoctor.trials.ranked.RankedTrialRun` (timed on the slowest rank).

Signals: under a command's :func:`torchdoctor.runner.signals.deferred` scope the first Ctrl-C,
SIGTERM or SIGHUP is recorded (a run in progress is interrupted by the launcher); from then on
:meth:`Trials.run` raises :class:`~torchdoctor.runner.signals.Stopped` and starts nothing, and
:meth:`Trials.interrupted` names the signal. The command reports what ran (exit 130).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.options import RunOptions
from torchdoctor.trials.run import TrialRun  # noqa: F401 - the run type, exported here too
from torchdoctor.trials.spec import Variation

TRIAL_NEEDS = frozenset({"loss_trace", "peak_memory"})
MIN_RUN_S = 5.0  # a run is not started with less budget left than this


class Trials:
    """Runs the script under variations; removes its temp dirs on close."""

    def __init__(self, probe: str, target: str, script_args: list[str], *,
                 options: RunOptions | Mapping[str, Any], budget_s: float | None = None,
                 main_run: bool = True):
        from torchdoctor.pipeline.run import check_target

        run_opts = RunOptions.of(options).resolved()
        self.probe = probe
        self.module = run_opts.module
        check_target(target, self.module)
        self.argv = [target, *script_args]
        self.opts = run_opts.wire()  # what each run's child reads, a variation's options on top
        # N ranks under torchrun per run (treat/repro --nproc-per-node N): trials/ranked.py
        self.nproc = int(run_opts.nproc_per_node or 0)
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.runs: list[TrialRun] = []
        # the session's first run is the command's main run (its writes are the user's files)
        # unless the command made that run itself (compile's compiled run): every other run is a
        # re-run whose writes are put back (runner/fileguard.py)
        self._started = 0 if main_run else 1
        self._tmp: list[Path] = []
        self._n = 0

    # ---- budget ------------------------------------------------------------------------
    def remaining_s(self) -> float | None:
        if self.budget_s is None:
            return None
        return self.budget_s - (time.monotonic() - self.t0)

    def expired(self) -> bool:
        left = self.remaining_s()
        return left is not None and left < MIN_RUN_S

    @staticmethod
    def interrupted() -> str | None:
        """The stop signal that ended the sequence (see the module's docstring), or None."""
        from torchdoctor.runner.signals import stopped

        return stopped()

    # ---- runs --------------------------------------------------------------------------
    def _dir(self, variation: Variation, round: int) -> Path:
        self._n += 1
        if self.opts.get("out"):
            from torchdoctor.runner.outdir import fresh_subdir

            return fresh_subdir(self.opts["out"], f"trial-{self._n:02d}-{variation.name}-{round}")
        d = Path(tempfile.mkdtemp(prefix="torchdoctor-trial-"))
        self._tmp.append(d)
        return d

    def run(self, variation: Variation, round: int = 0, *, probe: str | None = None,
            steps: int | None = None) -> TrialRun:
        """One bounded run of the script under ``variation`` (``probe``: whose instruments).

        Raises :class:`torchdoctor.runner.signals.Stopped` (nothing started) once a stop signal
        arrived: the command reports what ran, status ``interrupted``."""
        from torchdoctor.pipeline.registry import armed_needs
        from torchdoctor.runner.childio import QUIET_PATTERNS
        from torchdoctor.runner import signals
        from torchdoctor.runner.launch import launch

        signals.check()

        under = probe or self.probe
        opts = {**self.opts, **variation.options, "trial": variation.name, "trial_round": round}
        if self._started:
            opts["guard_files"] = True
        self._started += 1
        if steps is not None:
            opts["steps"] = steps
        timeout = float(opts["timeout"])
        left = self.remaining_s()
        if left is not None:
            timeout = max(1.0, min(timeout, left))
        d = self._dir(variation, round)
        needs = armed_needs(under) | TRIAL_NEEDS | variation.needs
        if self.nproc:  # every rank through torchrun, one rank dir each (trials/ranked.py)
            from torchdoctor.distributed.torchrun import RankSet, quiet_patterns
            from torchdoctor.trials.ranked import load_ranked

            res = launch(d, under, self.argv, module=self.module, options=opts, timeout=timeout,
                         quiet_patterns=QUIET_PATTERNS + quiet_patterns(dict(os.environ)),
                         show_progress=False, env=variation.env or None, needs=needs, echo=False,
                         ranks=RankSet(d, self.nproc))
            run: TrialRun = load_ranked(variation, round, d, self.nproc, res.wall_s)
            self.runs.append(run)
            return run
        res = launch(d, under, self.argv, module=self.module, options=opts, timeout=timeout,
                     quiet_patterns=QUIET_PATTERNS, show_progress=False, env=variation.env or None,
                     needs=needs, echo=False)
        run = TrialRun(variation, round, Evidence.load(d), res.wall_s)
        self.runs.append(run)
        return run

    def close(self) -> None:
        if not os.environ.get("TORCHDOCTOR_KEEP_RUN"):
            for d in self._tmp:
                shutil.rmtree(d, ignore_errors=True)
        self._tmp.clear()

    def __enter__(self) -> "Trials":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
