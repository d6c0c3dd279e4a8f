"""The session's fixture runs: each launched once, in background lanes while other tests run.

A run is keyed (fixture, command); the first caller of ``SESSION.once(key, make)`` owns it:
- a *planned* key (``SESSION.plan()``, from conftest at collection) is taken by a background lane,
  last-planned first, while the main thread runs the in-process tests;
- a test that needs a run no lane has taken yet launches it itself in its own thread, a test
  that needs a run a lane is doing waits for it.
The end-to-end fixture tests run last (conftest) and walk the plan from its start, so once the
main thread reaches them it is the other lane: the two meet in the middle of the plan.
A run that raised keeps its error: every test that needs that run raises it (the fixture's
name is in the message), none relaunches it.

Background launches do not see what a test did to the process meanwhile: the environment and
temp folder are those of collection time (``ENV``/``TMPDIR``), ``Popen`` is the class as it was
at import (a test may patch ``subprocess.Popen.__init__``), lane threads are daemons named
``fixture-lane-N`` (the harness's thread join skips daemons). ``SESSION.stop()`` (session end)
ends the lanes and terminates a run in flight, so no process outlives the session.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from typing import Callable, Hashable

ENV = dict(os.environ)
TMPDIR = tempfile.gettempdir()


class Popen(subprocess.Popen):
    __init__ = subprocess.Popen.__init__  # fixed now: unaffected by a test's monkeypatch


class _Slot:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value = None
        self.error: BaseException | None = None


class Lanes:
    """Keyed once-only jobs, taken by background lanes or by the first caller (SESSION: the
    test session's fixture runs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}
        self._planned: list[tuple[Hashable, Callable]] = []
        self._procs: set[subprocess.Popen] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def _claim(self, key: Hashable) -> tuple[_Slot, bool]:
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                return slot, False
            slot = self._slots[key] = _Slot()
            return slot, True

    @staticmethod
    def _fill(slot: _Slot, make: Callable) -> None:
        try:
            slot.value = make()
        except BaseException as e:  # noqa: BLE001 - kept for every test that needs this run
            slot.error = e
        finally:
            slot.done.set()

    def once(self, key: Hashable, make: Callable):
        """The value of ``make()`` for ``key``, computed once by whoever asks first (a lane or
        this caller); raises its error to every caller."""
        slot, mine = self._claim(key)
        if mine:
            self._fill(slot, make)
        else:
            slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _lane(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if not self._planned:
                    return
                key, make = self._planned.pop()  # from the plan's end: the main thread walks it from the start
            slot, mine = self._claim(key)
            if mine:
                self._fill(slot, make)

    def plan(self, jobs: list[tuple[Hashable, Callable]], lanes: int) -> None:
        """Start ``lanes`` background threads over ``jobs`` (in the order the tests need them)."""
        with self._lock:
            self._planned[:0] = [j for j in jobs if j[0] not in self._slots]
        for i in range(lanes):
            t = threading.Thread(target=self._lane, name=f"fixture-lane-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def track(self, p: subprocess.Popen, on: bool) -> None:
        """Register a run's process while it lives (``stop()`` terminates the ones left)."""
        with self._lock:
            (self._procs.add if on else self._procs.discard)(p)

    def stop(self, grace_s: float = 10.0) -> None:
        """Session end: no new runs; a run still in flight (an interrupted session) is
        terminated (torchdoctor forwards the stop to its child and reaps it), killed after
        ``grace_s``."""
        self._stopping.set()
        with self._lock:
            self._planned.clear()
            procs = list(self._procs)
        for p in procs:
            try:
                p.terminate()
                p.wait(grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
            except OSError:
                pass
        for t in self._threads:
            t.join(grace_s)


SESSION = Lanes()
