"""`torchdoctor ask`: the typer registration, for `--help` and for callers of the typer app.

Normal invocations never reach typer: ``torchdoctor.main.FAST_PATHS`` dispatches ``ask`` to
``torchdoctor.triage.cli_fast.main`` before typer is imported. This command takes its arguments
raw and hands them to that same implementation, so both paths behave identically.
"""

from __future__ import annotations

import typer

HELP = """Route a symptom, a pasted error or a whole log to the right diagnosis, in order.

\b
  torchdoctor ask SYMPTOM... [--json]
  torchdoctor ask - [--json]          read a log or traceback from stdin
  torchdoctor ask SYMPTOM... [--json] --run [PROBE OPTIONS] SCRIPT [ARGS]...

\b
Options:
  --json        one JSON object (docs/contract.md); with --run, the probe's
                report with the route in metrics.route
  --run SCRIPT  run the first route's probe on SCRIPT; the probe's options
                (--steps N) go before SCRIPT, what follows is the script's

stdin keeps the first 1 MiB and the last 256 KiB of a log (line numbers
stay right); on a pipe left open it answers 2 s after the last input.

Each route says why (the words or log lines that matched), the playbook steps (measure first) and
the command to run next. A query with no recognisable symptom gets one clarifying question.
From a log, the decisive line (the OOM line, the last exception, the first NaN) is quoted with its
numbers (bytes requested, capacity, allocated, reserved, free).

\b
Examples:
  torchdoctor ask "my loss goes nan after a while"
  torchdoctor ask "OOM with DDP on 8 GPUs" --json
  python train.py 2>&1 | tail -n 200 | torchdoctor ask -
"""


def register(app: typer.Typer) -> None:
    @app.command(
        name="ask",
        help=HELP,
        short_help="Route a symptom, pasted error or log to the right diagnosis.",
        options_metavar="[SYMPTOM... | -] [--json] [--run SCRIPT [ARGS]...]",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "allow_interspersed_args": False},
    )
    def ask(ctx: typer.Context) -> None:
        from torchdoctor.triage.cli_fast import main

        raise typer.Exit(main(list(ctx.args)))
