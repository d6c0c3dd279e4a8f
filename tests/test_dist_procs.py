"""`dist` processes and endings (issue 14 items 8, 9, 13): a rank's own crash is named as
such; stop signals during `dist SCRIPT` and the self-test give an interrupted report and leave
no process (torchrun, ranks, their subprocesses); a finished rank's subprocesses do not
survive. CPU, gloo, 2 ranks (about 4 s per torchrun launch)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from fixture_runs import run_fixture
from proc_helpers import Watched, kill_leftovers

DIST = ROOT / "tests" / "fixtures" / "scripts" / "dist"
pytestmark = pytest.mark.slow


def _rank_pids(prefix: Path) -> list[int]:
    out = []
    for p in prefix.parent.glob(prefix.name + ".rank*"):
        out += [int(x) for x in p.read_text().split()]
    return out


def test_a_rank_that_raises_is_script_crashed_on_that_rank_not_a_hang(tmp_path):
    p = run_fixture("dist/rank_raises.py", "dist --nproc-per-node 2 --timeout 90")  # the session's run
    r = p.report
    codes = [f["code"] for f in r["findings"]]
    assert codes == ["script-crashed"], r["findings"]
    f = r["findings"][0]
    assert f["title"].startswith("rank 1: the script raised ValueError at rank_raises.py:14")
    assert f["evidence"]["ranks"] == ["rank 1"]
    assert "rank 0" in f["evidence"]["other_rank_outcomes"]  # its error follows from rank 1's
    assert r["metrics"]["run"]["failed_rank"] == 1 and r["status"] == "crashed"
    assert p.returncode == 1


def test_subprocesses_of_finished_ranks_do_not_survive():
    """The session's run of dist/sampler_bugs.py (tests/test_fixtures.py, test_dist_script.py share
    it): each rank started a sleeper in a session of its own and one in a process group of its own,
    wrote their pids, trained and exited normally; torchdoctor was done when the run returned: none
    of the 4 sleepers is left."""
    run = run_fixture("dist/sampler_bugs.py", "dist --nproc-per-node 2 --timeout 90 --out {tmp} -- {tmp}/pids")
    # the ranks ended normally (the run's exit code is the sampler findings' 1)
    assert run.report["metrics"]["run"]["outcome"] == "exit", run.stderr[-3000:]
    assert [x["outcome"] for x in run.report["metrics"]["run"]["ranks"]] == ["exit", "exit"]
    pids = _rank_pids(run.tmp / "pids")
    assert len(pids) == 4

    def sleeper(pid: int) -> bool:  # alive and still the fixture's sleeper (not a recycled pid)
        try:
            proc = psutil.Process(pid)
            return proc.status() != psutil.STATUS_ZOMBIE and "time.sleep(600)" in " ".join(proc.cmdline())
        except psutil.Error:
            return False

    deadline = time.monotonic() + 3
    while (left := [p for p in pids if sleeper(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert left == []
    finally:
        kill_leftovers(left)


def test_sigterm_during_dist_script_reports_interrupted_and_leaves_nothing(tmp_path):
    prefix = tmp_path / "pids"
    w = Watched("dist", "--json", "--nproc-per-node", "2", "--timeout", "120", "stubborn_ranks.py",
                prefix, cwd=DIST)
    try:
        w.wait_for(b"rank 0 ready", timeout=120)
        w.wait_for(b"rank 1 ready", timeout=30)
        pids = _rank_pids(prefix)
        t0 = time.monotonic()
        w.signal(signal.SIGTERM)
        assert w.run_alive_at(t0 + 10, pids) == []  # torchrun, ranks, their subprocesses
        rc, out = w.finish(timeout=60)
        r = json.loads(out)
        assert rc == 130 and r["status"] == "interrupted", w.err[-3000:]
        assert r["metrics"]["run"]["interrupted_by"] == "SIGTERM"
        assert w.survivors(pids, within_s=1) == []
    finally:
        kill_leftovers(list(w.seen) + _rank_pids(prefix))


@pytest.mark.parametrize("sig", [signal.SIGINT])  # SIGTERM, SIGHUP: the same path (signals.catching)
def test_stop_signal_during_the_selftest_reports_and_leaves_nothing(tmp_path, sig):
    out_dir = tmp_path / "o"
    # big sizes and many repetitions: the self-test is still running when the signal comes
    w = Watched("dist", "--json", "--nproc-per-node", "2", "--timeout", "120", "--sizes", "4M,16M",
                "--out", out_dir)
    try:
        deadline = time.monotonic() + 120
        while not list((out_dir / "dist-selftest").glob("rank*.json")):
            assert time.monotonic() < deadline and w.proc.poll() is None, w.read_err()[-3000:]
            time.sleep(0.1)
        t0 = time.monotonic()
        w.signal(sig)
        assert w.run_alive_at(t0 + 10) == []  # torchrun and its ranks
        rc, out = w.finish(timeout=60)
        r = json.loads(out)
        assert rc == 130 and r["status"] == "interrupted", (rc, w.err[-3000:])
        assert r["metrics"]["dist"]["selftest"]["status"] == "interrupted"
        assert not [f for f in r["findings"] if f["code"] == "collective-selftest-failed"]
        assert w.survivors(within_s=1) == []
    finally:
        kill_leftovers(list(w.seen))
