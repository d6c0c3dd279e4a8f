"""The typer app: thin commands that parse, call, render. See commands/ for each command.

Each module named in ``COMMAND_MODULES`` defines ``register(app)``; it must import
nothing heavy at module level (torch, psutil, pynvml load inside the command body).
"""

from __future__ import annotations

import importlib
import os
from typing import Annotated, Optional

import typer

from torchdoctor.version import __version__

COMMAND_MODULES = [
    "ask",
    "env",
    "checkup",
    "profile",
    "compile",
    "memory",
    "nan",
    "treat",
    "gradcheck",
    "dist",
    "checkpoint_audit",
    "repro",
    "attach",
    "explain",
    "demo",
    "schema",
    "compare",
]

app = typer.Typer(
    name="torchdoctor",
    help="A command-line doctor for PyTorch training: route the symptom, measure the run, "
    "report findings. Diagnosis before solutions.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
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


def _expand_html(args: list[str]) -> list[str]:
    """A bare ``--html`` (no ``=PATH``) among the command's own options → its default value,
    so that the word after it (the script) is never taken as the path; ``--html PATH`` where
    PATH cannot be anything else (it ends in .html/.htm, or the command takes no positional
    argument) → ``--html=PATH``."""
    if "--html" not in args:
        return args
    from torchdoctor.report.html.output import expand_bare_html

    group = typer.main.get_command(app)  # click's objects (vendored by newer typer): duck-typed
    i = 0
    while i < len(args) and args[i].startswith("-"):  # root options (--debug)
        i += 1
    cmd = getattr(group, "commands", {}).get(args[i]) if i < len(args) else None
    if cmd is None:
        return args
    values = {o for p in cmd.params if getattr(p, "param_type_name", "") == "option"
              and not getattr(p, "is_flag", False) and not getattr(p, "count", False)
              for o in p.opts}
    inter = cmd.context_settings.get("allow_interspersed_args", True)
    positional = any(getattr(p, "param_type_name", "") == "argument" for p in cmd.params)
    return args[: i + 1] + expand_bare_html(args[i + 1:], values, inter, positional)


def _project_defaults(args: list[str]) -> dict:
    """click's ``default_map`` from ``[tool.torchdoctor]`` of the project's pyproject.toml
    (torchdoctor/config.py); the command line overrides it. Bad values: exit 2."""
    if not args or {"-h", "--help"} & set(args[:2]):
        return {}
    from torchdoctor.config import default_map, project_defaults
    from torchdoctor.errors import DoctorError

    try:
        path, defaults = project_defaults()
    except DoctorError as e:
        from torchdoctor.commands._common import eprint

        eprint(f"torchdoctor: error: {e.message}" + (f"\n  hint: {e.hint}" if e.hint else ""))
        raise SystemExit(e.exit_code) from None
    dm = default_map(typer.main.get_command(app), defaults) if defaults else {}
    cmd = next((a for a in args if not a.startswith("-")), None)
    if cmd in dm:
        from torchdoctor.commands._common import eprint

        eprint(f"torchdoctor: defaults from {path} [tool.torchdoctor]: "
               + ", ".join(f"{k.replace('_', '-')}={v}" for k, v in dm[cmd].items()))
    return {"default_map": dm} if dm else {}


def run_app(args: list[str]) -> int:
    """Run the typer app on ``args``; returns the exit code."""
    try:
        args = _expand_html(list(args))
        app(args=args, prog_name="torchdoctor", standalone_mode=True, **_project_defaults(args))
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    return 0
