"""The typer app: thin commands that parse, call, render. See commands/ for each command.

Each module named in ``COMMAND_MODULES`` defines ``register(app)``; it must import
nothing heavy at module level (torch, psutil, pynvml load inside the command body).
"""

from __future__ import annotations

import importlib
import os
from typing import Annotated, Optional

import typer

from torchdoctor import __version__

COMMAND_MODULES = [
    "ask",
    "env",
    "checkup",
    "profile",
    "memory",
    "nan",
    "dist",
    "checkpoint_audit",
    "repro",
    "explain",
    "demo",
]

app = typer.Typer(
    name="torchdoctor",
    help="A command-line doctor for PyTorch training: route the symptom, measure the run, "
    "report findings. Diagnosis before solutions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"torchdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    if debug:
        os.environ["TORCHDOCTOR_DEBUG"] = "1"


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"torchdoctor.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"torchdoctor.commands.{name}":
                continue  # command not built yet
            raise
        mod.register(app)


_register_all()


def run_app(args: list[str]) -> int:
    """Run the typer app on ``args``; returns the exit code."""
    try:
        app(args=args, prog_name="torchdoctor", standalone_mode=True)
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    return 0
