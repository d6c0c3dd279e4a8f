"""`torchdoctor ask`, dispatched before typer loads (``torchdoctor.main.FAST_PATHS``).

    torchdoctor ask SYMPTOM... [--json]
    torchdoctor ask - [--json]                       # a log or traceback on stdin
    torchdoctor ask SYMPTOM... [--json] --run SCRIPT [ARGS]...

Everything after ``--run SCRIPT`` belongs to the script, untouched. Imports: json (for --json),
rich (console only); never torch, psutil, pynvml or typer. Exit codes: 0 answered (a route or a
clarifying question), 2 bad usage, 3 internal error; with --run, the probe's own exit code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from torchdoctor.errors import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, ISSUES_URL, DoctorError

USAGE = ("usage: torchdoctor ask SYMPTOM... [--json] [--run SCRIPT [ARGS]...]\n"
         "       torchdoctor ask - [--json]   (reads a log or traceback from stdin)")
OPTIONS = ("--json", "--run", "--")


@dataclass
class Args:
    words: list[str] = field(default_factory=list)
    stdin: bool = False
    as_json: bool = False
    run: list[str] | None = None  # SCRIPT ARGS... (or PATH for checkpoint-audit)


def parse(argv: list[str]) -> Args:
    """Exact parser: options before --run; after --run SCRIPT everything is the script's."""
    a = Args()
    i = 0
    only_words = False
    while i < len(argv):
        tok = argv[i]
        if only_words:
            a.words.append(tok)
        elif tok == "--run":
            if i + 1 >= len(argv):
                raise DoctorError("--run needs a SCRIPT", hint="torchdoctor ask \"loss is nan\" --run train.py")
            a.run = argv[i + 1:]
            break
        elif tok == "--json":
            a.as_json = True
        elif tok == "--":
            only_words = True
        elif tok == "-":
            a.stdin = True
        elif tok.startswith("--"):
            import difflib

            near = difflib.get_close_matches(tok, OPTIONS, n=1, cutoff=0.6)
            raise DoctorError(f"unknown option {tok!r} for ask",
                              hint=f"did you mean {near[0]}?" if near else USAGE.splitlines()[0])
        else:
            a.words.append(tok)  # "-inf", "-1" and other words stay words
        i += 1
    if a.stdin and a.words:
        raise DoctorError("give either SYMPTOM words or '-' (read stdin), not both", hint=USAGE.splitlines()[1])
    if not a.stdin and not " ".join(a.words).strip():
        raise DoctorError("missing SYMPTOM: describe what you see, or pipe a log into `torchdoctor ask -`",
                          hint="e.g. torchdoctor ask \"loss becomes NaN after epoch 3\"")
    return a


def clean_arg(s: str) -> str:
    """An argument as text: bytes that were not UTF-8 (kept by Python as lone surrogates, which a
    strict stdout cannot encode) become U+FFFD, as on stdin."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def read_stdin():
    """stdin within bounds (``triage.stdin``): a StdinText with the text, its gap and the limits met."""
    if sys.stdin is None:
        raise DoctorError("'-' reads stdin, but there is no stdin")
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        raise DoctorError("'-' reads stdin, but there is no stdin") from None
    tty = os.isatty(fd)
    if tty:
        print("torchdoctor ask: reading a log from stdin (end with Ctrl-D)", file=sys.stderr, flush=True)
    from torchdoctor.triage.stdin import read_stdin_bounded

    got = read_stdin_bounded(fd, tty=tty)
    if not got.text.strip():
        raise DoctorError("nothing on stdin", hint="torchdoctor ask - < train.log")
    return got


def json_text(obj) -> str:
    """JSON with every control character escaped: json escapes C0 itself; DEL, C1 and bidi controls
    (untrusted text from a pasted log) become ``\\uXXXX`` too, so stdout never carries them raw."""
    import json

    from torchdoctor.safe import json_visible

    return json_visible(json.dumps(obj, indent=2, ensure_ascii=False))


def _emit(answer, as_json: bool, to_stderr: bool = False) -> None:
    stream = sys.stderr if to_stderr else sys.stdout
    if as_json:
        stream.write(json_text(answer.to_dict()) + "\n")
        stream.flush()
    else:
        from torchdoctor.triage.render import make_console, render

        render(answer, make_console(stderr=to_stderr))


def run(argv: list[str]) -> int:
    a = parse(argv)
    from torchdoctor.triage.matcher import triage

    if a.stdin:
        got = read_stdin()
        answer = triage(got.text, source="stdin", gap=got.gap)
        answer.limits[:0] = got.limits
    else:
        answer = triage(clean_arg(" ".join(a.words)), source="args")
    if a.run is None:
        _emit(answer, a.as_json)
        return EXIT_OK
    if not answer.routes:
        _emit(answer, False, to_stderr=True)  # the clarifying question
        raise DoctorError("no route to run yet: answer the question above first",
                          hint="describe the symptom, e.g. torchdoctor ask \"training is slow\" --run train.py")
    from torchdoctor.triage.handoff import command_of, run_probe_for_route, script_of

    first = answer.routes[0]
    command = command_of(first.probe)  # the skill's probe, or the variant's (repro, compile)
    script = script_of(command, a.run)
    answer.script = clean_arg(script) if script else None  # shown only; the probe gets a.run untouched
    # one document: the probe's own report (stdout, its exit code) carries the route in full as
    # metrics["route"] (why, probe, playbook, the routes after it, the decisive line, the command
    # to run after it), drawn first
    return run_probe_for_route(command, a.run, a.as_json, route=answer.route_for_run())


def _silence_stdout() -> None:
    """The reader went away (`| head`): send the rest of stdout, and the final flush, nowhere."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str]) -> int:
    """Entry point of FAST_PATHS: returns the exit code, never raises (except SystemExit)."""
    try:
        code = run(argv)
        sys.stdout.flush()
        return code
    except DoctorError as e:
        from torchdoctor.safe import visible  # a path or pasted text in the message is data

        print(visible(f"torchdoctor: error: {e.message}"), file=sys.stderr)
        if e.hint:
            print(visible(f"  hint: {e.hint}"), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("torchdoctor: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `torchdoctor ask ... | head`
        _silence_stdout()
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - the one place ask's internal errors are caught
        if os.environ.get("TORCHDOCTOR_DEBUG", "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        from torchdoctor.safe import visible

        print(visible(f"torchdoctor: internal error: {type(e).__name__}: {e}"), file=sys.stderr)
        print(f"  This is a bug in torchdoctor, not in your code. Please report it at {ISSUES_URL}",
              file=sys.stderr)
        return EXIT_INTERNAL


__all__ = ["main", "parse", "run", "USAGE", "EXIT_USAGE"]
