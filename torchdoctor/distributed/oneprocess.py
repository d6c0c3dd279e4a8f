"""A command that runs the script in one process (``repro``) asked for several ranks.

They accept ``--nproc-per-node N`` only to refuse it with the reasons (before, the option was taken
for the script: "script not found: --nproc-per-node"). What each would need on N ranks, and what
to run instead, is stated here once (docs/dist.md "One-process commands on ranked scripts").
``treat`` was refused here too until it ran its trials on N ranks itself (torchdoctor/treat/ranked_session.py).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Optional

import typer

from torchdoctor.errors import DoctorError

WHY = {
    "repro": (
        "repro compares two runs of one process step by step, and --resume-check restarts one process "
        "from its own torch.save checkpoint. On N ranks it would need: both runs launched through "
        "torchrun and compared rank by rank; the restart's state reset on every rank at the same save; "
        "and DCP saves (torch.distributed.checkpoint.save of get_state_dict: FSDP2's sharded model and "
        "optimizer) located and reset like torch.save files. None of that is built, so a ranked "
        "resume cannot be checked here."),
}
INSTEAD = {
    "repro": ("Instead: `torchdoctor checkpoint-audit DIR` reads the DCP folder the ranks wrote (which ranks "
              "wrote it, missing shards, optimizer state); `torchdoctor profile --nproc-per-node N SCRIPT` "
              "and `checkup --nproc-per-node N SCRIPT` run it on N ranks; a script that can train as one "
              "rank runs under repro with RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 "
              "MASTER_PORT=<free port> set (its checkpoint then holds one shard)."),
}


def refuse(command: str, nproc: int | None) -> None:
    """Raise the command's refusal when ``--nproc-per-node`` was given (exit 2, before any run)."""
    if nproc is None:
        return
    raise DoctorError(f"{command} runs the script in one process: --nproc-per-node {nproc} is not "
                      f"supported. {WHY[command]}", hint=INSTEAD[command])


def nproc_param(command: str) -> inspect.Parameter:
    """The ``--nproc-per-node`` option of a one-process command (parsed only to refuse it)."""
    return inspect.Parameter(
        "nproc_per_node", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[Optional[int], typer.Option(
            "--nproc-per-node", metavar="N", show_default=False,
            help=f"Not supported: {command} runs one process (the error says why and what to run instead).")])
