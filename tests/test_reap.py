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
