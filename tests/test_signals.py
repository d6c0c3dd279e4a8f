"""Stop signals to torchdoctor (issue 14, items 8, 9, 14): SIGTERM, SIGHUP and SIGINT give a
report that says the run was interrupted (exit 130), and no process of the run survives,
whatever the script does (ignores every signal, DataLoader workers, a subprocess in a group
or a session of its own). A SIGKILLed torchdoctor takes its child down too."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import ROOT
from proc_helpers import Watched, kill_leftovers

PROC = ROOT / "tests" / "fixtures" / "scripts" / "proc"
RUN = ROOT / "tests" / "fixtures" / "scripts" / "run"
pytestmark = pytest.mark.slow


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


# SIGINT on a script that handles it: tests/test_runner.py::test_ctrl_c_still_gives_a_report
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_gives_an_interrupted_report_and_leaves_nothing(tmp_path, sig):
    pids_file = tmp_path / "pids.txt"
    w = Watched("checkup", "--json", "--timeout", "120", "stubborn.py", pids_file, cwd=PROC)
    pids: list[int] = []
    try:
        w.wait_for(b"ready")
        pids = _pids(pids_file)
        t0 = time.monotonic()
        w.signal(sig)
        rc, out = w.finish(timeout=30)
        took = time.monotonic() - t0
        r = json.loads(out)
        assert rc == 130, w.err[-2000:]
        assert r["status"] == "interrupted"
        run = r["metrics"]["run"]
        assert run["outcome"] == "interrupted" and run["interrupted_by"] == signal.Signals(sig).name
        assert run["killed_after_interrupt"] is True  # it ignored the forwarded SIGINT
        assert r["metrics"]["steps"]["count"] == 2
        assert took < 10, took
        assert w.survivors(pids, within_s=10 - took) == []
    finally:
        kill_leftovers(list(w.seen) + pids)


def test_second_signal_kills_at_once_and_console_says_interrupted(tmp_path):
    pids_file = tmp_path / "pids.txt"
    w = Watched("checkup", "--timeout", "120", "stubborn.py", pids_file, cwd=PROC)
    pids: list[int] = []
    try:
        w.wait_for(b"ready")
        pids = _pids(pids_file)
        t0 = time.monotonic()
        w.signal(signal.SIGTERM)
        time.sleep(0.5)
        w.signal(signal.SIGTERM)
        rc, out = w.finish(timeout=30)
        assert time.monotonic() - t0 < 4  # not the 5 s grace
        assert rc == 130
        assert "Run interrupted by SIGTERM after 2 steps, killed" in " ".join(out.split()), out
        assert "✓ No problems found" not in out
        assert w.survivors(pids) == []
    finally:
        kill_leftovers(list(w.seen) + pids)


def test_signal_early_during_start_up_leaves_nothing(tmp_path):
    """A stop signal while the child is still importing torch: still no survivor."""
    w = Watched("checkup", "--json", "stubborn.py", tmp_path / "pids.txt", cwd=PROC)
    try:
        # once torchdoctor has started its child (its stop handlers are in place by then), not
        # after a fixed 1 s: on a loaded box torchdoctor's own start took longer and the SIGTERM
        # met the default action (exit -15, no report)
        deadline = time.monotonic() + 60
        while len(w.seen) < 2 and w.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(w.seen) >= 2, w.read_err()[-2000:]
        w.signal(signal.SIGTERM)
        rc, out = w.finish(timeout=30)
        assert rc == 130
        assert json.loads(out)["status"] == "interrupted"
        assert w.survivors() == []
    finally:
        kill_leftovers(list(w.seen))


def test_sigkill_of_torchdoctor_takes_the_child_with_it(tmp_path):
    """PR_SET_PDEATHSIG: the child dies with its parent, even one killed without warning, and
    the guard it forked at boot kills what the script left."""
    import psutil

    from proc_helpers import alive

    pids_file = tmp_path / "pids.txt"
    w = Watched("checkup", "--timeout", "120", "stubborn.py", pids_file, cwd=PROC)
    try:
        w.wait_for(b"ready")
        child = psutil.Process(w.proc.pid).children()[0]
        created = child.create_time()
        w.signal(signal.SIGKILL)
        w.finish(timeout=30)
        t0 = time.monotonic()
        deadline = t0 + 5
        while alive(child.pid, created) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child.pid, created)
        # its guard then kills what the script started: a group and a session of their own,
        # DataLoader workers
        assert w.survivors(_pids(pids_file), within_s=10 - (time.monotonic() - t0)) == []
    finally:
        kill_leftovers(list(w.seen) + (_pids(pids_file) if pids_file.exists() else []))


def test_subprocesses_left_by_a_finished_script_are_killed(tmp_path):
    pids_file = tmp_path / "pids.txt"
    w = Watched("checkup", "--json", "escape_after_exit.py", pids_file, cwd=PROC)
    try:
        rc, out = w.finish(timeout=120)
        assert rc == 0, w.err[-2000:]
        assert json.loads(out)["metrics"]["run"]["outcome"] == "exit"
        assert w.survivors(_pids(pids_file), within_s=3) == []
    finally:
        kill_leftovers(list(w.seen) + (_pids(pids_file) if pids_file.exists() else []))


def test_the_guard_is_not_a_child_of_the_script():
    """A script that reaps "any child" (os.wait) meets only its own children."""
    from fixture_runs import run_fixture

    p = run_fixture("proc/wait_any_child.py", "checkup")  # the session's run
    assert "waited for my child" in p.stderr and "no other child" in p.stderr, p.stderr[-2000:]
