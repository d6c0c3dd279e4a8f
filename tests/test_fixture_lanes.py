"""The session's fixture runs (tests/fixture_lanes.py, conftest): planned from the selected e2e
tests only, launched once each by a background lane or by the first test that needs them, kept
apart from what the tests running meanwhile do to the process, and stopped at session end."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from conftest import ROOT
from fixture_lanes import ENV, Lanes, Popen
from fixture_runs import headed_fixtures


def _collect(tmp_path, *args) -> tuple[list[str], list[str]]:
    """(planned fixture runs, collected test ids) of `pytest --collect-only ARGS`."""
    plan = tmp_path / "plan.txt"
    env = dict(os.environ, FIXTURE_PLAN_FILE=str(plan), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 5), p.stdout[-3000:] + p.stderr[-3000:]
    ids = [line for line in p.stdout.splitlines() if "::" in line]
    return [r for r in plan.read_text().splitlines() if r], ids


def test_a_gpu_session_plans_no_cpu_fixture_run(tmp_path):
    """`make test-gpu` (-m "gpu or multigpu"): the 88 CPU fixtures were launched by the first
    GPU fixture's cached run before the plan followed the selection."""
    planned, ids = _collect(tmp_path, "-m", "gpu or multigpu", "tests/test_fixtures.py")
    assert planned == [] and ids  # the GPU fixtures are collected, no CPU run is planned


def test_the_plan_is_the_selected_cpu_fixtures_and_their_tests_run_last(tmp_path):
    planned, ids = _collect(tmp_path, "-k", "not nan", "tests/test_fixtures.py")  # e2e tests first in the file
    cpu = [h.rel for h in headed_fixtures() if not h.requires and not h.skip and "nan" not in h.rel]
    assert planned == cpu and cpu
    e2e = [i for i, t in enumerate(ids) if "test_fixture_raises_its_header" in t]
    assert e2e and e2e == list(range(len(ids) - len(e2e), len(ids)))  # after every other test


def test_a_run_is_made_once_by_a_lane_or_by_the_first_caller():
    lanes = Lanes()
    made, started, release = [], threading.Event(), threading.Event()

    def job(name, block=False):
        def make():
            made.append((name, threading.current_thread().name))
            if block:
                started.set()
                release.wait(10)
            return name.upper()
        return make

    a, b = job("a"), job("b", block=True)
    lanes.plan([("a", a), ("b", b)], lanes=1)
    assert started.wait(10)  # the lane took the plan's last run first
    assert lanes.once("a", a) == "A"  # the lane is busy: this caller runs it
    threading.Timer(0.2, release.set).start()
    assert lanes.once("b", b) == "B"  # the lane's run, waited for
    lanes.stop()
    assert sorted(made) == [("a", "MainThread"), ("b", "fixture-lane-0")]


def test_a_failed_run_raises_its_error_to_every_test_that_needs_it():
    lanes, calls = Lanes(), []

    def boom():
        calls.append(1)
        raise RuntimeError("perf/x.py: no JSON on stdout (exit 3)")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="perf/x.py: no JSON"):
            lanes.once("x", boom)
    assert calls == [1]


def test_session_end_terminates_a_run_in_flight():
    lanes = Lanes()
    p = Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lanes.track(p, True)
    lanes.stop(grace_s=5)
    assert p.poll() is not None


def test_background_launches_ignore_what_a_running_test_patches(monkeypatch):
    """A test's env (RANK=3 ...) or a patched Popen.__init__ (tests/test_threads.py) reached a
    fixture run a lane started meanwhile."""
    def no_fork(*a, **k):
        raise AssertionError("patched")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_fork)
    monkeypatch.setenv("TD_LANES_PROBE", "1")
    with Popen([sys.executable, "-c", "import os; assert 'TD_LANES_PROBE' not in os.environ"],
               env=ENV) as p:
        assert p.wait(60) == 0
    assert "TD_LANES_PROBE" not in ENV


def test_a_timed_share_printed_as_a_whole_number_is_masked():
    """profile/cpu_slow_python.py's golden differed under load: `({py_ms:.3g} of {step_ms:.3g} ms)`
    printed "(2 of 3.41 ms)", and only decimal numbers were masked."""
    from fixture_runs import norm_text

    masked = "Python outside torch ops takes <pct> of the step (<num> of <dur>); hottest: f at x.py:17"
    for got in ("(2 of 3.41 ms)", "(2.25 of 3.41 ms)", "(12 of 30 ms)"):
        assert norm_text(f"Python outside torch ops takes 40% of the step {got}; hottest: f at x.py:17") == masked


def test_how_far_a_killed_rank_got_is_masked():
    """dist/mismatch.py's golden differed between two regens on one box: rank 0 dies by SIGABRT
    after the mismatched collective, having reported 0 or 3 steps."""
    from fixture_runs import normalise

    def report(steps0):
        ranks = [{"outcome": "signal", "rank": 0, "signal": "SIGABRT", "steps": steps0},
                 {"exit_code": 1, "outcome": "crash", "rank": 1, "steps": 3}]
        metrics = {"run": {"ranks": ranks, "steps": steps0, "wall_s": 1.0}}
        if steps0:
            metrics["ranks"] = {"judged_steps": 2, "per_rank": [{"rank": 0, "steps": steps0}]}
            metrics["steps"] = {"count": steps0}
            metrics["run"]["time_to_first_step_s"] = 0.5
        skipped = [{"rule": "sampler-epoch-not-set",
                    "reason": "no DataLoader with a DistributedSampler" if steps0 else "no DataLoader was iterated"}]
        return {"status": "crashed", "findings": [], "metrics": metrics, "skipped": skipped}

    a, b = report(0), report(3)
    a["context"], b["context"] = {"ranks": 2}, {"ranks": 2, "device": "cpu"}  # rank 0's first step wrote it
    a["metrics"]["run"]["launcher_returncode"], b["metrics"]["run"]["launcher_returncode"] = 0, 1
    assert normalise(a) == normalise(b)
    healthy = {"status": "ok", "findings": [], "metrics": {"run": {"ranks": [{"rank": 0, "steps": 3}]}}}
    assert normalise(healthy)["metrics"]["run"]["ranks"][0]["steps"] == 3  # kept where none died


def test_the_memory_site_window_is_masked():
    """memory/eval_with_grad.py: the site window opened in one regen and not in the next."""
    from fixture_runs import normalise

    a = {"status": "ok", "findings": [], "metrics": {"memory": {"sites": {"reason": "heap"}, "x": 1}}}
    b = {"status": "ok", "findings": [], "metrics": {"memory": {"x": 1}}}
    assert normalise(a) == normalise(b)


def test_the_host_heap_verdict_is_masked_and_a_cuda_one_is_kept():
    """memory/eval_with_grad.py: the heap trend said "not growth" in most runs and growth "full
    in ~11 min" in 2 of 6 (CI of stop 24 and the next local run)."""
    from fixture_runs import normalise

    def rep(heap, cuda):
        return {"status": "ok", "findings": [], "metrics": {"memory": {"trend": {
            "heap": {"growth": heap, "label": "host"}, "cuda:0": {"growth": cuda}}}}}
    drift = rep({"severity": "error", "steps_until_full": 700000}, {"not_growth": "flat"})
    calm = rep({"not_growth": "r2 0.2"}, {"not_growth": "flat"})
    assert normalise(drift) == normalise(calm)
    assert normalise(rep({"not_growth": "x"}, {"severity": "error"})) != normalise(calm)


def test_where_a_run_stepping_past_the_clean_stop_was_killed_is_masked():
    """proc/swallows_stop.py: killed in its sleep (:19) in one run, in opt.step() (:16) in the next."""
    from fixture_runs import normalise

    def rep(line, code):
        return {"status": "timeout", "metrics": {}, "skipped": [], "findings": [{
            "code": "script-hung", "title": f"did not stop; killed after 61 steps at s.py:{line} in <module>",
            "evidence": {"clean_stop_grace_s": 5.0, "stuck_at": f"s.py:{line} in <module>",
                         "waiting_in": f"s.py:{line} in <module>", "code": code, "steps_done": 61}}]}
    assert normalise(rep(19, "time.sleep(0.2)")) == normalise(rep(16, "opt.step()"))
    hang = rep(19, "time.sleep(0.2)")
    del hang["findings"][0]["evidence"]["clean_stop_grace_s"]  # a real hang: its line is kept
    assert "s.py:19" in normalise(hang)["findings"][0]["evidence"]["stuck_at"]


# ---- host noise ---------------------------------------------------------------------------
def _growth(**ev):
    return {"code": "memory-growth", "severity": "info", "evidence": ev}


def test_an_unnamed_info_growth_is_host_noise_and_a_named_one_is_not():
    """Regression: the mask looked for `sites`, which the rule fills with the sentence saying why
    no site was named, so the drift it was meant to mask failed CI (memory/eval_with_grad.py)."""
    from fixture_runs import host_noise
    unnamed = _growth(series="host memory in use", sites="no tensor outlived its step and CPU tensors did not grow")
    assert host_noise(unnamed)
    assert not host_noise(_growth(growing_sites=["train.py:12: +1.0 KiB/step"], sites=None))
    assert not host_noise(_growth(graph_growth=["train.py:9: a tensor made here holds an autograd graph"]))
    assert not host_noise({**unnamed, "severity": "warning"})
