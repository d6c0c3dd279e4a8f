"""``torchdoctor checkup SCRIPT``: one bounded run with every light instrument armed."""

from __future__ import annotations

import typer

from torchdoctor.commands._script import script_command

HELP = ("Run SCRIPT once, bounded (--steps, --timeout), with every lightweight probe armed: "
        "step-time split, data wait, crashes, hangs, and the memory/NaN/training-bug checks.")


def register(app: typer.Typer) -> None:
    script_command(app, "checkup", HELP, probe="checkup")
