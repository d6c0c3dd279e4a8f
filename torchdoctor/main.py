"""Console entry point. Keeps start-up cheap: heavy modules load only inside commands.

Commands listed in ``FAST_PATHS`` are dispatched before typer is imported (typer +
click cost ≈ 60–200 ms, see bench/startup.py); ``--help`` always goes through typer.
"""

from __future__ import annotations

import importlib
import sys

# command name -> "module:function" taking argv (list[str]) and returning an exit code
FAST_PATHS: dict[str, str] = {
    "ask": "torchdoctor.triage.cli_fast:main",
}


def _asks_for_help(args: list[str]) -> bool:
    """--help/-h among torchdoctor's own options: those before ``--run`` (the script's follow it)."""
    own = args[: args.index("--run")] if "--run" in args else args
    return bool({"--help", "-h"} & set(own))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    from torchdoctor.safe import harden_output

    harden_output()  # every output stream with an error handler that cannot raise (lone surrogates)
    if args and args[0] in FAST_PATHS and not _asks_for_help(args[1:]):
        mod_name, fn_name = FAST_PATHS[args[0]].split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        sys.exit(fn(args[1:]))
    from torchdoctor.cli import run_app

    sys.exit(run_app(args))
