"""Errors that end a command with a clear message instead of a traceback.

`DoctorError` is bad usage or unreadable input (exit 2). It is caught once, in
`torchdoctor.cli`, printed as one line plus an optional hint. Anything else that
escapes a command is an internal failure (exit 3, "please report").
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130  # the run was stopped by Ctrl-C, SIGTERM or SIGHUP (128 + SIGINT)

ISSUES_URL = "https://github.com/torchdoctor/torchdoctor/issues"


class DoctorError(Exception):
    """A problem with the user's input or invocation: message + hint, exit code 2."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
