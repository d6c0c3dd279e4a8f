"""What every command shares: the --json/--fail-on options, error guard, report output."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from torchdoctor.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, ISSUES_URL, DoctorError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.")]
HtmlOpt = Annotated[
    Optional[str],
    typer.Option("--html", metavar="[=PATH]", show_default=False,
                 help="Also write a self-contained HTML report: --html (torchdoctor-report.html in "
                      "--out, or here), --html=PATH, or --html PATH.html (a space works when PATH "
                      "ends in .html or .htm; otherwise the next word is the command's own)."),
]
# the same option on a command that takes no positional argument (demo, env): any next word
# that is not an option can only be the path (cli._expand_html)
HtmlOptNoArgs = Annotated[
    Optional[str],
    typer.Option("--html", metavar="[PATH]", show_default=False,
                 help="Also write a self-contained HTML report: --html (torchdoctor-report.html "
                      "here), --html PATH or --html=PATH."),
]
SarifOpt = Annotated[Optional[str], typer.Option(
    "--sarif", metavar="PATH", show_default=False,
    help="Also write the findings as SARIF 2.1.0 (GitHub code scanning): one rule per code, file:line.")]
JunitOpt = Annotated[Optional[str], typer.Option(
    "--junit", metavar="PATH", show_default=False,
    help="Also write JUnit XML: one test case per finding code judged; warnings and errors fail.")]
FailOnOpt = Annotated[
    str,
    typer.Option("--fail-on", help="Lowest severity that makes the exit code 1: error or warning.",
                 metavar="error|warning"),
]


# Facts a caller in the same process attaches to the next report (e.g. `ask --run` puts the
# route it took here, so the probe's report shows the route before its findings).
ATTACHED_METRICS: dict = {}


def debug_enabled() -> bool:
    return os.environ.get("TORCHDOCTOR_DEBUG", "") not in ("", "0")


def eprint(msg: str) -> None:
    """One line of torchdoctor's own on stderr. Its untrusted parts (a script or file name, an
    exception's text) are data: control bytes, bidi overrides and lone surrogates are escaped
    here, the one stderr writer of the commands (safe.py)."""
    from torchdoctor.safe import visible

    print(visible(msg, keep_newlines=True), file=sys.stderr, flush=True)


def fail_usage(err: DoctorError) -> None:
    eprint(f"torchdoctor: error: {err.message}")
    if err.hint:
        eprint(f"  hint: {err.hint}")
    raise typer.Exit(err.exit_code)


def fail_internal(exc: BaseException) -> None:
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    eprint(f"torchdoctor: internal error: {type(exc).__name__}: {exc}")
    eprint(f"  This is a bug in torchdoctor, not in your code. Please report it at {ISSUES_URL}"
           + ("" if debug_enabled() else " with the output of the same command run with --debug."))
    raise typer.Exit(EXIT_INTERNAL)


def guarded(fn: Callable) -> Callable:
    """Wrap a command body: DoctorError -> one line + hint, exit 2; other exceptions -> exit 3."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from torchdoctor.safe import harden_output
        from torchdoctor.runner.signals import Stopped, raising

        from torchdoctor.runner.outdir import release_all

        harden_output()  # no string torchdoctor prints can make stdout or stderr raise
        try:
            with raising():  # SIGTERM and SIGHUP end a command the way Ctrl-C does
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except DoctorError as e:
            fail_usage(e)
        except (KeyboardInterrupt, Stopped) as e:  # Stopped: no run may start (guarded_runs)
            by = f" by {getattr(e, 'signame', None) or e}" if str(e) else ""
            try:
                eprint(f"torchdoctor: interrupted{by}")
            except (OSError, ValueError):
                pass
            raise typer.Exit(EXIT_INTERRUPTED)
        except Exception as e:  # noqa: BLE001 - the one place internal errors are caught
            fail_internal(e)
        finally:
            release_all()  # the --out lock

    return wrapper


def guarded_runs(fn: Callable) -> Callable:
    """:func:`guarded` for a command that runs the script (once, or a sequence: repro, treat,
    compile's eager run, checkup's follow-ups): the first stop signal (Ctrl-C, SIGTERM, SIGHUP)
    stops the sequence instead of unwinding it; the report of what ran is printed with status
    ``interrupted`` (:func:`emit`) and the exit code is 130. A second signal ends at once."""

    @functools.wraps(fn)
    def deferring(*args, **kwargs):
        from torchdoctor.runner.signals import deferred

        with deferred():
            return fn(*args, **kwargs)

    return guarded(deferring)


def prepare_out(out: str | None) -> str | None:
    """Check and claim ``--out DIR`` before any work (exit 2 with one line if it is unfit: a
    file, unwritable, someone else's folder, in use by another run). The one check every
    command with ``--out`` calls; see :mod:`torchdoctor.runner.outdir`."""
    if out is None:
        return None
    from torchdoctor.runner.outdir import claim

    return str(claim(out))


def prepare_html(html: str | None, out: str | None) -> Path | None:
    """Check ``--html`` before any work (exit 2 if unfit); the file to write, or None."""
    from torchdoctor.report.html.output import html_target

    return html_target(html, out)


def prepare_outputs(**paths: str | None) -> dict[str, Path]:
    """Check ``--sarif``/``--junit`` (by format name) before any work (exit 2 if unfit)."""
    from torchdoctor.report.formats import check_target

    return {name: p for name, p in ((n, check_target(n, v)) for n, v in paths.items()) if p is not None}


def check_fail_on(value: str) -> str:
    v = value.strip().lower()
    if v not in ("error", "warning"):
        raise DoctorError(f"--fail-on must be 'error' or 'warning', not {value!r}")
    return v


def emit(report, as_json: bool, fail_on: str = "error", out_dir: str | Path | None = None,
         html: Path | None = None, outputs: dict[str, Path] | None = None) -> None:
    """Print ``report`` (JSON or console) on stdout, save it under ``out_dir`` (JSON, text,
    HTML), to ``html`` (from :func:`prepare_html`) and to each of ``outputs`` (format name →
    file, from :func:`prepare_outputs`: SARIF, JUnit), exit with its code."""
    from torchdoctor.report.jsonout import render_json

    from torchdoctor.runner.signals import stopped

    fail_on = check_fail_on(fail_on)
    if stopped() and report.run_status not in ("interrupted", "error"):
        report.run_status = "interrupted"  # a stop signal ended the sequence (guarded_runs)
    for key, value in ATTACHED_METRICS.items():
        report.metrics.setdefault(key, value)
    if out_dir is not None:
        from torchdoctor.report.console import render_to_text
        from torchdoctor.report.html.output import OUT_NAME, report_html

        from torchdoctor.runner.outdir import claim, write_file

        out = claim(out_dir)  # claimed before the work by the command: this only re-checks
        report.artifacts.setdefault("report", str(out / "report.json"))
        report.artifacts.setdefault("report_html", str(out / OUT_NAME))
        if html is not None and html.resolve() == (out / OUT_NAME).resolve():
            html = None  # the bare --html under --out: this same file
    if html is not None:
        report.artifacts.setdefault("html", str(html))
    for name, path in (outputs or {}).items():
        report.artifacts.setdefault(name, str(path))
    if out_dir is not None:
        write_file(out / "report.json", render_json(report) + "\n")
        write_file(out / "report.txt", render_to_text(report))
        write_file(out / OUT_NAME, report_html(report))
    files = {**({"html": html} if html is not None else {}), **(outputs or {})}
    if files:  # every file format renders the one report dict (torchdoctor/report/formats.py)
        import json

        from torchdoctor.report.formats import write

        data = json.loads(render_json(report))
        for name, path in files.items():
            try:
                write(name, path, data)
            except OSError as e:  # the report is still printed; the file is what failed
                eprint(f"torchdoctor: could not write --{name} {path}: {e.strerror or e}")
    if as_json:
        sys.stdout.write(render_json(report) + "\n")
        sys.stdout.flush()
    else:
        from torchdoctor.report.console import make_console, render

        render(report, make_console())
    raise typer.Exit(report.exit_code(fail_on))
