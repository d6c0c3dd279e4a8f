"""``torchdoctor profile SCRIPT``: where the step time goes (a torch.profiler window).

The script runs once, bounded (``--steps``, default 20); after ``--skip`` warm-up steps a
profiler window of ``--window`` steps records ops, kernels, copies and Python stacks, is
analysed in the child and judged by the performance rules (``torchdoctor/rules/profile.py``
and the step-clock rules). With ``--out DIR`` the Perfetto/Chrome trace is kept as
``DIR/trace.json`` (gzip above ``--trace-max-mb``).
"""

from __future__ import annotations

import typer

from torchdoctor.commands._script import ExtraOption, script_command

HELP = ("Profile a few steps of SCRIPT after warm-up: step-time split, top ops and kernels, "
        "host syncs and pageable copies with your file:line, float32 GEMM share, GPU idle time. "
        "--out DIR keeps the trace (open it in https://ui.perfetto.dev).")
DEFAULT_STEPS = 20


def register(app: typer.Typer) -> None:
    script_command(app, "profile", HELP, probe="profile", steps_default=DEFAULT_STEPS,
                   extra_options=[
                       ExtraOption("profile_skip", "--skip", int, None,
                                   "Steps to run before the profiler window (default 5, fewer "
                                   "when --steps is small).", "N", min=0),
                       ExtraOption("profile_active", "--window", int, 3,
                                   "Steps recorded by the profiler.", "N", min=1),
                       ExtraOption("trace_max_mb", "--trace-max-mb", float, 256.0,
                                   "Largest trace kept under --out (gzip above it).", "MB", min=0.1),
                   ])
