"""A command that runs the script in one process (``repro``) asked for several ranks.

Plain ``repro`` accepts ``--nproc-per-node N`` only to refuse it with the reasons (its resume check
runs on N ranks: ``repro --resume-check --nproc-per-node N``, reprocheck/resume_ranked.py); before,
the option was taken for the script: "script not found: --nproc-per-node". What it would need on N
ranks, and what to run instead, is stated here once (docs/dist.md "One-process commands on ranked
scripts").
``treat`` was refused here too until it ran its trials on N ranks itself (torchdoctor/treat/ranked_session.py).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Optional

import typer

from torchdoctor.errors import DoctorError

WHY = {
    "repro": (
        "repro compares two runs of one process step by step (the data batch, forward outputs, gradients "
        "and update of every step, then a localising pair that hashes every op): on N ranks that would "
        "need each rank's fingerprints matched across two torchrun launches and the op traces of the "
        "collectives, which is not built. What runs on N ranks is the resume check: `repro "
        "--resume-check --nproc-per-node N` launches the baseline and the restarts through torchrun, "
        "resets the state on every rank at the same save (a DCP save or a torch.save on every rank) and "
        "compares losses and LR rank by rank."),
}
INSTEAD = {
    "repro": ("Instead: `torchdoctor repro --resume-check --nproc-per-node N SCRIPT` (does the script's own "
              "checkpoint resume exactly, rank by rank); `checkup --nproc-per-node N SCRIPT` runs it on N "
              "ranks; a script that can train as one rank runs under plain repro with RANK=0 WORLD_SIZE=1 "
              "LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port> set."),
}


def refuse(command: str, nproc: int | None) -> None:
    """Raise the command's refusal when ``--nproc-per-node`` was given (exit 2, before any run)."""
    if nproc is None:
        return
    raise DoctorError(f"{command} runs the script in one process: --nproc-per-node {nproc} is not "
                      f"supported. {WHY[command]}", hint=INSTEAD[command])


def nproc_param(command: str, help: str | None = None) -> inspect.Parameter:
    """The ``--nproc-per-node`` option of a one-process command (parsed to refuse it, or, with
    ``help``, for the part of the command that runs on N ranks)."""
    return inspect.Parameter(
        "nproc_per_node", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[Optional[int], typer.Option(
            "--nproc-per-node", metavar="N", show_default=False,
            help=help or f"Not supported: {command} runs one process (the error says why and what to run "
                         f"instead).")])
