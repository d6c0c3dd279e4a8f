"""``torchdoctor checkup SCRIPT``: one bounded run with every light instrument armed."""

from __future__ import annotations

import typer

from torchdoctor.commands._script import ExtraOption, script_command

HELP = ("Run SCRIPT once, bounded (--steps, --timeout), with every lightweight probe armed: "
        "step-time split, data wait, crashes, hangs, and the memory/NaN/training-bug checks. "
        "When the loss turns NaN/Inf, one replay to that step with every module output watched "
        "names the layer, the op and the line.")


def register(app: typer.Typer) -> None:
    script_command(app, "checkup", HELP, probe="checkup", extra_options=[
        ExtraOption("rerun", "--rerun/--no-rerun", bool, True,
                    "When the loss turns non-finite, replay the script to that step with the "
                    "forward watch on to name the layer and op (one extra run to that step)."),
    ])
