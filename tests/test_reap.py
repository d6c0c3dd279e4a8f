"""runner/reap.py: the run's processes are found by session, parent tree and environment marker,
and nothing else is (fast, no torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from torchdoctor.runner.reap import RUN_ID_ENV, Tracker, all_stats, has_proc

pytestmark = pytest.mark.skipif(not has_proc(), reason="needs /proc (Linux)")
SLEEP = [sys.executable, "-c", "import time; time.sleep(30)"]


def _spawn(env_value: str | None, **kw) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(RUN_ID_ENV, None)
    if env_value is not None:
        env[RUN_ID_ENV] = env_value
    return subprocess.Popen(SLEEP, env=env, **kw)


def test_marker_matches_the_run_and_its_narrowed_tokens_only():
    procs = [_spawn(v, start_new_session=True) for v in ("tok", "tok.11", "tok.111", "tok1", None)]
    try:
        time.sleep(0.2)
        stats = all_stats()
        broad = Tracker(procs[-1].pid, marker="tok")
        broad.sessions, broad.seen = set(), {}
        assert sorted(broad._members(stats, by_marker=True)) == sorted(p.pid for p in procs[:3])
        narrow = Tracker(procs[-1].pid, marker="tok.11")
        narrow.sessions, narrow.seen = set(), {}
        assert list(narrow._members(stats, by_marker=True)) == [procs[1].pid]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_kill_all_reaches_a_grandchild_that_left_the_session_after_a_snapshot():
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
            " start_new_session=True)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(30)\n")
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env={k: v for k, v in os.environ.items()
                                                         if k != RUN_ID_ENV})
    grandchild = int(root.stdout.readline())
    tr = Tracker(root.pid)
    tr.snapshot()  # sees the grandchild (its own session) while its parent lives
    root.kill()
    root.wait()  # the grandchild is an orphan now: not in the root's tree any more
    assert tr.kill_all() == []
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] in "ZX":
                    break
        except OSError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the grandchild survived")


def test_adoption_takes_orphans_not_the_hosts_other_children():
    """Regression: adoption took every child of this process started after the run, so a run
    launched in-process (treat's trials, the tests) SIGKILLed the host's unrelated children:
    pytest's background fixture runs died with exit -9 while an in-process run ended. An orphan
    of the run (re-parented to us, its own session, no marker) is still adopted."""
    root = _spawn(None, start_new_session=True)
    time.sleep(0.05)
    tr = Tracker(root.pid, adopt_after=time.monotonic(), marker="ours")
    time.sleep(0.02)  # /proc start times are in clock ticks: the others start after the root
    host_child = _spawn(None)  # the host's own child: our session
    other_run = _spawn("theirs", start_new_session=True)  # a run started beside ours
    orphan = _spawn(None, start_new_session=True)  # what a setsid'd orphan looks like to us
    try:
        time.sleep(0.2)
        members = tr._members(all_stats())
        assert root.pid in members and orphan.pid in members
        assert host_child.pid not in members and other_run.pid not in members
        assert tr.kill_all() == []
        assert host_child.poll() is None and other_run.poll() is None
    finally:
        for p in (root, host_child, other_run, orphan):
            p.kill()
            p.wait()
