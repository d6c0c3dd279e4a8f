"""``torchdoctor memory SCRIPT``: memory timeline, leaks with their sites, OOM breakdown."""

from __future__ import annotations

import typer

from torchdoctor.commands._script import ExtraOption, script_command

HELP = ("Run SCRIPT once under the memory probe: per-step memory timeline (CUDA allocator or "
        "host heap), breakdown (parameters, gradients, optimizer state, activations), leaks "
        "with the lines that allocate what grows, an out-of-memory breakdown with ranked fixes "
        "and, on CUDA with --out, a memory_viz snapshot of the OOM.")


def register(app: typer.Typer) -> None:
    script_command(app, "memory", HELP, probe="memory", extra_options=[
        ExtraOption("memory_history", "--history/--no-history", bool, True,
                    "CUDA: record the stack of each live allocation (names OOM sites; the "
                    "OOM snapshot for memory_viz)."),
        ExtraOption("memory_history_trace", "--history-trace", bool, False,
                    "CUDA: also keep the last 20000 alloc/free events (memory_viz timeline); "
                    "the host heap is then not judged."),
    ])
