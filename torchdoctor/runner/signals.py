"""SIGINT, SIGTERM and SIGHUP to torchdoctor: one meaning, "stop the run and report".

Ctrl-C, a CI cancel or a scheduler's pre-emption (SIGTERM), a closed terminal (SIGHUP) and a
script that signals its parent all end a run the same way: the signal is forwarded to the
child as SIGINT (the script sees ``KeyboardInterrupt`` and its evidence is written), the child
gets a grace period, then everything the run started is killed and the report printed with
status ``interrupted`` (exit 130). A second signal kills at once.

* :func:`catching` (while a child runs): the handlers only record the signal; the launcher's
  loop acts on it within its poll period, so nothing is interrupted half-way.
* :func:`raising` (around a whole command): the handlers raise :class:`Interrupted`, a
  ``KeyboardInterrupt``, as Ctrl-C does by default; the command's guard reports it.
* :func:`deferred` (around a command that runs the script, once or many times: ``repro``,
  ``treat``, ``compile``'s eager run, the follow-ups of ``checkup``): the first signal is only
  recorded, wherever the parent is (between two runs, loading evidence, judging); a run that a
  signal interrupted records it too (:func:`note_stop`, from the launcher). No further run
  starts once a stop is recorded (:func:`stopped`; the trials layer raises :class:`Stopped`),
  the report of what ran is printed with status ``interrupted`` and the exit code is 130. A
  second signal outside a run raises :class:`Interrupted` at once.

Handlers can only be set from the main thread; elsewhere both are no-ops (Ctrl-C keeps
Python's default). Never imports torch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP"))
                if s is not None)
EXIT_INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """A stop signal turned into an exception (``signum``: which one)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(name(signum))
        self.signum = signum


def name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _installed(handler) -> Iterator[None]:
    if not _main_thread():
        yield
        return
    old = {}
    for s in SIGNALS:
        try:
            prev = signal.getsignal(s)
            if s != signal.SIGINT and prev is signal.SIG_IGN:
                continue  # nohup / a parent that wants us immune: stay immune
            old[s] = prev
            signal.signal(s, handler)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for s, prev in old.items():
            try:
                signal.signal(s, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass


class Stopped(Exception):
    """No further run may start: a stop signal arrived (``signame``: the first one)."""

    def __init__(self, signame: str):
        super().__init__(f"interrupted by {signame}")
        self.signame = signame


class Deferred:
    """The first stop signal of a :func:`deferred` scope (its name), recorded, not raised."""

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, signum, _frame) -> None:
        if self.first is not None:
            raise Interrupted(signum)  # the second: at once
        self.first = name(signum)


_SCOPES: list[Deferred] = []


@contextlib.contextmanager
def deferred() -> Iterator[Deferred]:
    scope = Deferred()
    _SCOPES.append(scope)
    try:
        with _installed(scope):
            yield scope
    finally:
        _SCOPES.remove(scope)


def note_stop(signame: str) -> None:
    """A run was interrupted by ``signame`` (the launcher caught it): the enclosing
    :func:`deferred` scopes stop too. Outside any scope: nothing to do."""
    for scope in _SCOPES:
        if scope.first is None:
            scope.first = signame


def stopped() -> str | None:
    """The first stop signal recorded in the innermost :func:`deferred` scope, or None."""
    return _SCOPES[-1].first if _SCOPES else None


def check() -> None:
    """Raise :class:`Stopped` when a stop signal was recorded: call before starting a run."""
    signame = stopped()
    if signame is not None:
        raise Stopped(signame)


class Pending:
    """Signals received, oldest first (``catching``)."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def __call__(self, signum, _frame) -> None:
        self.signals.append(signum)

    def take(self) -> list[int]:
        got, self.signals = self.signals, []
        return got


@contextlib.contextmanager
def catching() -> Iterator[Pending]:
    pending = Pending()
    with _installed(pending):
        yield pending


def _raise(signum, _frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def raising() -> Iterator[None]:
    with _installed(_raise):
        yield
