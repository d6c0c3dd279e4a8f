"""``torchdoctor nan SCRIPT``: the first non-finite value (module, op, step) and training bugs."""

from __future__ import annotations

import typer

from torchdoctor.commands._script import ExtraOption, script_command

HELP = ("Run SCRIPT and find the first NaN/Inf: the step, the first module whose output turned "
        "non-finite (else the gradient, else the loss), its input/output stats and source line, "
        "and the op (one re-run of that step); plus exploding gradients, missing zero_grad, "
        "float16 without GradScaler, eval-mode training, unused or unoptimized parameters.")


def register(app: typer.Typer) -> None:
    script_command(app, "nan", HELP, probe="nan", extra_options=[
        ExtraOption("check_every", "--check-every", int, 1,
                    "Read the finiteness flags every N steps (one device sync each read).", "N"),
        ExtraOption("rerun", "--rerun/--no-rerun", bool, True,
                    "Re-run up to the bad step to name the op and exact stats."),
        ExtraOption("forward_watch", "--forward-watch/--no-forward-watch", bool, True,
                    "Check every module's outputs (off: loss and gradients only, cheaper; the "
                    "re-run then checks the bad step's whole forward op by op)."),
    ])
