"""Stop signals to the multi-run commands end to end (issue 28, item 8): the real launcher, real
runs of ``tests/fixtures/scripts/proc/counted_starts.py`` (each start appended to a file, so the
test signals inside the run it means).

Before the fix: SIGTERM in run A of ``repro`` let run B (and the pairs after it) start and the
command ended 21 s later; SIGHUP or Ctrl-C inside a later run gave exit 0. Now: no further run
starts, the report of what ran is printed with status ``interrupted``, exit 130, nothing left
running. Between-run signals (parent not in a run) are driven in ``test_interrupt_sequences.py``.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import ROOT
from proc_helpers import Watched, kill_leftovers

PROC = ROOT / "tests" / "fixtures" / "scripts" / "proc"
SCRIPT = "counted_starts.py"
pytestmark = pytest.mark.slow


_MOST: dict[Path, int] = {}


def _starts(path: Path) -> int:
    """The most runs of the script seen started so far: the file is the user's, so a re-run's line
    is taken out again when that run ends (runner/fileguard.py); :class:`_Counter` polls it."""
    try:
        n = len(path.read_text().splitlines())
    except FileNotFoundError:
        n = 0
    _MOST[path] = max(_MOST.get(path, 0), n)
    return _MOST[path]


class _Counter:
    """Polls the starts file every 20 ms while the command runs (a run lasts seconds)."""

    def __init__(self, path: Path):
        import threading

        self.path, self.done = path, False
        self.t = threading.Thread(target=self._poll, daemon=True)
        self.t.start()

    def _poll(self) -> None:
        while not self.done:
            _starts(self.path)
            time.sleep(0.02)

    def stop(self) -> int:
        self.done = True
        self.t.join()
        return _starts(self.path)


def _signal_in_run(w: Watched, starts: Path, n: int, sig: int, settle_s: float = 1.5) -> float:
    """Wait until the n-th run of the script has started, let it settle, signal torchdoctor;
    returns the time of the signal."""
    deadline = time.monotonic() + 240
    while _starts(starts) < n:
        if time.monotonic() > deadline or w.proc.poll() is not None:
            raise AssertionError(f"run {n} never started: {w.read_err()[-3000:]!r}")
        time.sleep(0.1)
    time.sleep(settle_s)
    t = time.monotonic()
    w.signal(sig)
    return t


def _finish(w: Watched, t_signal: float, counter: "_Counter") -> tuple[int, dict, float]:
    rc, out = w.finish(timeout=60)
    counter.stop()
    took = time.monotonic() - t_signal
    assert out.strip(), w.err[-3000:]
    return rc, json.loads(out), took


@pytest.mark.parametrize("sig, run", [(signal.SIGTERM, 1), (signal.SIGINT, 2)])
def test_repro_stops_in_the_run_it_was_signalled_in(tmp_path, sig, run):
    starts = tmp_path / "starts.txt"
    w = Watched("repro", "--json", "--steps", "30", "--timeout", "120", SCRIPT, starts, "40", cwd=PROC)
    counter = _Counter(starts)
    try:
        t = _signal_in_run(w, starts, run, sig)
        rc, rep, took = _finish(w, t, counter)
        assert _starts(starts) == run  # no run started after the signal
        assert took < 15, took  # the 5 s grace at most, then the report
        assert rc == 130, w.err[-3000:]
        assert rep["status"] == "interrupted"
        data = rep["metrics"]["repro"]
        assert data["compared"] is False and data["interrupted"] == signal.Signals(sig).name
        assert "interrupted by" in data["reason"]
        assert len(starts.read_text().splitlines()) == 1  # run 2 is a re-run: its line was taken out
        assert w.survivors() == []
    finally:
        counter.done = True
        kill_leftovers(list(w.seen))


def test_treat_stops_in_its_second_run(tmp_path):
    starts = tmp_path / "starts.txt"
    w = Watched("treat", "--json", "--try", "set-to-none", "--steps", "6", "--timeout", "120", SCRIPT,
                starts, "40", cwd=PROC)
    counter = _Counter(starts)
    try:
        t = _signal_in_run(w, starts, 2, signal.SIGHUP, settle_s=1.0)
        rc, rep, took = _finish(w, t, counter)
        assert rc == 130, w.err[-3000:]
        assert rep["status"] == "interrupted"
        assert rep["metrics"]["treat"]["stopped"] == "interrupted"
        assert _starts(starts) == 2 and took < 15, took
        # the file is the user's: the signalled re-run's line was taken out again (runner/fileguard.py,
        # the files after treat are its main run's; the end-to-end check of a finished re-run's
        # writes is test_file_guard's, on repro: both commands' re-runs are Trials' guarded runs)
        assert len(starts.read_text().splitlines()) == 1, starts.read_text()
        assert w.survivors() == []
    finally:
        counter.done = True
        kill_leftovers(list(w.seen))


def test_compile_eager_run_interrupted_gives_the_compiled_report(tmp_path):
    starts = tmp_path / "starts.txt"
    w = Watched("compile", "--json", "--steps", "8", "--timeout", "180", SCRIPT, starts, "40", "--compile",
                cwd=PROC)
    counter = _Counter(starts)
    try:
        t = _signal_in_run(w, starts, 2, signal.SIGTERM)
        rc, rep, took = _finish(w, t, counter)
        assert rc == 130, w.err[-3000:]
        assert rep["status"] == "interrupted"
        m = rep["metrics"]["compile"]
        assert m["compiled"] and m["eager_skipped"].startswith("the eager run was interrupted by SIGTERM")
        assert _starts(starts) == 2 and took < 15, took
        assert w.survivors() == []
    finally:
        counter.done = True
        kill_leftovers(list(w.seen))
