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

Under pytest-xdist (``make test`` runs two workers) each worker is a session with its own lanes,
and a run is still made once per test run, not once per worker: the controller makes one shared
folder (``SHARED_ENV``, conftest) and a key's value is made under an ``flock`` on its file there
and left pickled beside it. A worker that needs a key another worker is making waits on the
lock and reads the pickle; a background lane skips a key another worker holds and takes the
next. The runs' kept folders live in that folder too (``TMPDIR``), removed by the controller
once every worker is done, so a worker may read a run another worker made after it exited.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import subprocess
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable, Hashable

SHARED_ENV = "TD_FIXTURE_SHARED"  # "PID:FOLDER": the xdist controller's shared folder
UNSET_ENV = "TD_XDIST_UNSET"  # what an xdist worker finds set that the controller did not have
# An xdist worker starts with COLUMNS=80 and LINES=24 that the command line did not set: help
# texts and reports would wrap at 80 in the workers and not in a serial run (the tests assume
# their own width, COLUMNS=120 by default). The controller names them (conftest), each worker
# drops them here, before the environment snapshot below.
for _name in filter(None, os.environ.pop(UNSET_ENV, "").split(",")):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop(_name, None)
ENV = dict(os.environ)


def _shared_folder() -> Path | None:
    """The shared folder when this process is a worker of the controller that made it (not a
    pytest that a test started, which inherits the variable)."""
    pid, _, folder = ENV.get(SHARED_ENV, "").partition(":")
    if folder and ENV.get("PYTEST_XDIST_WORKER") and pid == str(os.getppid()):
        return Path(folder)
    return None


SHARED = _shared_folder()
TMPDIR = str(SHARED) if SHARED is not None else tempfile.gettempdir()


class Popen(subprocess.Popen):
    __init__ = subprocess.Popen.__init__  # fixed now: unaffected by a test's monkeypatch


class _Slot:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value = None
        self.error: BaseException | None = None


class _Held:
    """An ``flock`` on a key's file in the shared folder, and the key's pickled value beside it."""

    def __init__(self, root: Path, key: Hashable, wait: bool) -> None:
        name = hashlib.sha1(repr(key).encode()).hexdigest()[:24]
        self.value_path = root / f"{name}.pickle"
        self.fd = os.open(root / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            self.held = True
        except BlockingIOError:  # another worker is making it
            self.held = False
            os.close(self.fd)

    def release(self) -> None:
        if self.held:
            os.close(self.fd)  # closing the only descriptor of this open releases the lock
            self.held = False

    def make(self, make: Callable):
        """The key's value: read if another worker made it, else made here and left for them."""
        try:
            if self.value_path.exists():
                kind, payload = pickle.loads(self.value_path.read_bytes())
            else:
                try:
                    kind, payload = "value", make()
                except BaseException as e:  # noqa: BLE001 - kept for every worker's tests
                    kind, payload = "error", e
                try:
                    blob = pickle.dumps((kind, payload))
                except Exception:  # noqa: BLE001 - what does not pickle goes as its text
                    text = "".join(traceback.format_exception(payload)) if kind == "error" else repr(payload)
                    blob = pickle.dumps(("error", RuntimeError(text)))
                part = self.value_path.with_suffix(".part")
                part.write_bytes(blob)
                part.replace(self.value_path)
        finally:
            self.release()
        if kind == "error":
            raise payload  # here: the error itself; in another worker, its pickle or its text
        return payload


class Lanes:
    """Keyed once-only jobs, taken by background lanes or by the first caller (SESSION: the
    test session's fixture runs)."""

    def __init__(self, shared: Path | None = None) -> None:
        self._shared = shared
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
            if self._shared is not None:
                held = _Held(self._shared, key, wait=True)
                self._fill(slot, lambda: held.make(make))
            else:
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
                if key in self._slots:
                    continue
            held = None
            if self._shared is not None:
                held = _Held(self._shared, key, wait=False)
                if not held.held:
                    continue  # another worker is making it: a test that needs it waits there
            slot, mine = self._claim(key)
            if mine:
                self._fill(slot, (lambda: held.make(make)) if held is not None else make)
            elif held is not None:
                held.release()

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


SESSION = Lanes(SHARED)
