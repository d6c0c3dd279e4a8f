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

With ``options["nproc_per_node"] = N`` each run is one torchrun launch of N ranks (the ranked
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

from torchdoctor.evidence import Evidence
from torchdoctor.trials.spec import Variation

TRIAL_NEEDS = frozenset({"loss_trace", "peak_memory"})
MIN_RUN_S = 5.0  # a run is not started with less budget left than this


@dataclass
class TrialRun:
    """One bounded run under one variation, as the comparisons read it."""

    variation: Variation
    round: int
    evidence: Evidence
    wall_s: float

    def step_ms(self, exclude: Collection[int] = ()) -> list[float]:
        """Time of each judged step (warm-up left out), in ms, by the one step-time basis (on
        CUDA the longer of host wall and device span: ``evidence/steps.py``); ``exclude``: step
        numbers left out too (e.g. the steps in which torch.compile compiled)."""
        from torchdoctor.evidence.steps import judged_steps, step_seconds

        steps = [s for s in judged_steps(self.evidence) if int(s.get("step", 0)) not in exclude]
        return [t * 1e3 for t in step_seconds(self.evidence, steps)[0]]

    def window(self, exclude: Collection[int] = ()) -> dict[str, Any] | None:
        """The synchronised window of a CUDA trial run (``trial_window``: a synchronize at its
        start and end, so steps / window time is exact), when it holds no excluded step."""
        w = self.evidence.last("trial_window")
        if not w or not w.get("steps") or not w.get("wall_s"):
            return None
        from torchdoctor.evidence.steps import counted_steps

        lo, hi = int(w["from_step"]), int(w["to_step"])
        if any(lo <= int(s) <= hi for s in [*exclude, *counted_steps(self.evidence)]):
            return None
        return w

    def median_ms(self, exclude: Collection[int] = ()) -> float | None:
        """The run's step time: window wall / steps when a synchronised window was measured
        (CUDA), else the median of :meth:`step_ms`."""
        from torchdoctor.trials.compare import median

        w = self.window(exclude)
        if w is not None:
            return float(w["wall_s"]) / int(w["steps"]) * 1e3
        return median(self.step_ms(exclude))

    def time_basis(self, exclude: Collection[int] = ()) -> str:
        from torchdoctor.evidence.steps import judged_steps, step_seconds

        if self.window(exclude) is not None:
            return "synchronised window (steps / wall between two cuda synchronize)"
        return step_seconds(self.evidence, judged_steps(self.evidence)[:1])[1]

    def losses(self) -> list:
        """Per-step losses in step order (None: no backward that step; "nan"/"inf" strings)."""
        tr = self.evidence.last("loss_trace")
        if not tr:
            return []
        by_step = dict(zip(tr.get("steps", []), tr.get("losses", [])))
        n = max(by_step, default=0)
        return [by_step.get(s) for s in range(1, n + 1)]

    def peak_memory(self) -> tuple[int | None, str]:
        """(bytes, what): the CUDA allocator peak summed over devices, else the host peak RSS."""
        pk = self.evidence.last("peak_memory") or {}
        cuda = pk.get("cuda") or {}
        if cuda:
            return int(sum(cuda.values())), "cuda-allocated"
        rss = pk.get("host_rss")
        return (int(rss) if rss is not None else None), "host-rss"

    def peak_reserved(self) -> int | None:
        """The CUDA caching allocator's reserved peak summed over devices (None on CPU): what
        fragmentation and the allocator's configuration change."""
        res = (self.evidence.last("peak_memory") or {}).get("cuda_reserved") or {}
        return int(sum(res.values())) if res else None

    def interrupted(self) -> bool:
        """The run was stopped by Ctrl-C / SIGTERM / SIGHUP (forwarded to the child)."""
        res = self.evidence.result or {}
        return res.get("outcome") == "interrupted" or bool(res.get("interrupted"))

    def failure(self) -> str | None:
        """Why this run cannot be compared (crash, timeout, no step), or None."""
        res = self.evidence.result or {}
        outcome = res.get("outcome")
        if outcome == "crash":
            exc = res.get("exception") or {}
            uf = exc.get("user_frame") or {}
            where = f" at {uf.get('file')}:{uf.get('line')}" if uf else ""
            msg = str(exc.get("message", "")).strip().splitlines()
            return f"{exc.get('type', 'error')}: {msg[0] if msg else ''}{where}"[:500]
        if outcome == "timeout":
            return f"timed out after {res.get('timeout_s')} s"
        if outcome in ("signal", "interrupted"):
            return f"run ended by {res.get('signal') or res.get('interrupted_by') or outcome}"
        if outcome == "exit" and res.get("exit_code") not in (0, None):
            return f"the script exited with code {res.get('exit_code')}"
        if not self.evidence.of("step"):
            return "no training step was measured"
        return None


class Trials:
    """Runs the script under variations; removes its temp dirs on close."""

    def __init__(self, probe: str, target: str, script_args: list[str], *,
                 options: dict[str, Any], budget_s: float | None = None, main_run: bool = True):
        from torchdoctor.pipeline.run import DEFAULT_TIMEOUT_S, check_target

        self.probe = probe
        self.module = bool(options.get("module"))
        check_target(target, self.module)
        self.argv = [target, *script_args]
        self.opts = {k: v for k, v in options.items() if k not in ("module", "quiet")}
        # N ranks under torchrun per run (treat --nproc-per-node N): trials/ranked.py
        self.nproc = int(options.get("nproc_per_node") or 0)
        self.opts.setdefault("timeout", DEFAULT_TIMEOUT_S)
        if self.opts.get("out"):
            self.opts["out"] = str(Path(self.opts["out"]).resolve())
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
