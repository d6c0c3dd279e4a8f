"""``torchdoctor compile SCRIPT``: what torch.compile did — graph breaks, recompiles, cost, gain.

1. The script runs once, bounded (``--steps``, default 30), with dynamo's own diagnostics
   switched on from outside (instruments ``dynamo_diag`` and ``dynamo_counters``; no edit of
   the script, nothing more printed) and is judged by the compile rules
   (``torchdoctor/rules/compile.py``): graph breaks by user line, recompiles by guard, the
   recompile limit, or no torch.compile at all.
2. When something was compiled, the same script runs again for the same steps with dynamo
   switched off from outside (a trial, ``TORCH_COMPILE_DISABLE=1``): the steady step time of the
   compiled run (steps that compiled nothing, warm-up left out) is compared with the eager
   run's same steps: ``metrics.compile.speedup``. ``--no-eager`` skips that run.
"""

from __future__ import annotations

from typing import Any

import typer

from torchdoctor.commands._script import ExtraOption, script_command
from torchdoctor.pipeline.options import DEFAULT_TIMEOUT_S, RunOptions

HELP = ("What torch.compile does with SCRIPT: graph breaks (your line, the reason, whether the "
        "whole function fell back to eager), recompiles (the failing guard), the recompile "
        "limit, compile time apart from the steady step time, and the measured speed-up over "
        "an eager run of the same steps (compilation switched off from outside).")
DEFAULT_STEPS = 30


def eager_comparison(report: Any, target: str, args: list[str],
                     options: RunOptions | dict[str, Any]) -> None:
    """Run the script eager (dynamo off) for the same steps; add the comparison to the report."""
    options = RunOptions.of(options)
    m = report.metrics.get("compile")
    if not m or not m.get("compiled") or options.probe.get("no_eager"):
        return
    if report.run_status in ("crashed", "timeout", "interrupted"):
        m["eager_skipped"] = "the compiled run did not finish"
        return
    if options.nproc_per_node:
        m["eager_skipped"] = "not measured under --nproc-per-node (run the script alone for it)"
        return
    from torchdoctor.commands._common import eprint
    from torchdoctor.compilecheck import EAGER_ENV
    from torchdoctor.compilecheck.compare import compare_eager
    from torchdoctor.runner.signals import stopped
    from torchdoctor.trials import Trials, Variation

    if stopped():  # a stop signal after the compiled run: no eager run (the report says interrupted)
        m["eager_skipped"] = f"interrupted by {stopped()}"
        return
    eager = Variation("eager", "torch.compile switched off (TORCH_COMPILE_DISABLE=1)", env=dict(EAGER_ENV))
    eprint("torchdoctor compile: the same steps again with torch.compile switched off (eager)")
    with Trials("compile", target, args, options=options, main_run=False,  # the compiled run was the main one
                budget_s=float(options.timeout or DEFAULT_TIMEOUT_S)) as trials:
        run = trials.run(eager)
        if run.interrupted():
            m["eager_skipped"] = f"the eager run was interrupted by {trials.interrupted() or 'a signal'}"
            return
        m.update(compare_eager(m, run.evidence, run.failure()))


def register(app: typer.Typer) -> None:
    script_command(app, "compile", HELP, probe="compile", steps_default=DEFAULT_STEPS,
                   extra_options=[ExtraOption("no_eager", "--no-eager", bool, False,
                                              "Skip the eager run (no speed-up figure).")],
                   after=eager_comparison)
