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


def _recorded_jobs():
    """(made, started, release, job): job(name, block) makes name.upper(), noting (name, thread)
    in made; a blocking one sets started and waits for release."""
    made, started, release = [], threading.Event(), threading.Event()

    def job(name, block=False):
        def make():
            made.append((name, threading.current_thread().name))
            if block:
                started.set()
                release.wait(10)
            return name.upper()
        return make

    return made, started, release, job


def test_a_run_is_made_once_by_a_lane_or_by_the_first_caller():
    lanes = Lanes()
    made, started, release, job = _recorded_jobs()
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


# ---------------------------------------------------------------- xdist: two workers, one folder
# Two Lanes over one shared folder stand for two workers: flock locks conflict between two opens
# of the same file in one process as they do between processes.

def test_two_workers_make_a_shared_run_once_and_both_read_it(tmp_path):
    one, two = Lanes(shared=tmp_path), Lanes(shared=tmp_path)
    made, started, release = [], threading.Event(), threading.Event()

    def make():
        made.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return {"report": "r"}

    first = threading.Thread(target=lambda: one.once("k", make), name="worker-one")
    first.start()
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    assert two.once("k", make) == {"report": "r"}  # waited for the other worker's run, then read it
    first.join(10)
    assert made == ["worker-one"]


def test_a_lane_skips_a_run_another_worker_is_making_and_takes_the_next(tmp_path):
    one, two = Lanes(shared=tmp_path), Lanes(shared=tmp_path)
    made, started, release, job = _recorded_jobs()
    busy = threading.Thread(target=lambda: one.once("b", job("b", block=True)), name="worker-one")
    busy.start()
    assert started.wait(10)
    two.plan([("a", job("a")), ("b", job("b"))], lanes=1)  # its lane starts from the end: "b"
    assert two.once("a", job("a")) == "A"
    release.set()
    busy.join(10)
    assert two.once("b", job("b")) == "B"  # read, not made again
    two.stop()
    assert sorted(made) == [("a", "fixture-lane-0"), ("b", "worker-one")] or \
        sorted(made) == [("a", "MainThread"), ("b", "worker-one")]


def test_a_shared_runs_error_reaches_the_other_worker_even_if_it_does_not_pickle(tmp_path):
    one, two = Lanes(shared=tmp_path), Lanes(shared=tmp_path)

    class Local(Exception):  # a class pickle cannot find by name
        pass

    def boom():
        raise Local("dist/x.py: no report within 300 s (killed)")

    with pytest.raises(Local):
        one.once("x", boom)
    with pytest.raises(RuntimeError, match="dist/x.py: no report within 300 s"):
        two.once("x", lambda: pytest.fail("made twice"))


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


def _expectation(report):
    import sys

    from fixture_runs import GOLDEN
    sys.path.insert(0, str(GOLDEN))
    from expect import expectation
    return expectation(0, report)


def test_a_timed_share_in_a_title_is_not_expected():
    """profile/cpu_slow_python.py's golden differed under load: `({py_ms:.3g} of {step_ms:.3g} ms)`
    printed "(2 of 3.41 ms)". Its expectation holds no title, and its hot spot's place is kept."""
    def rep(share):
        return {"status": "findings", "findings": [{
            "code": "python-overhead", "severity": "warning",
            "title": f"Python outside torch ops takes 40% of the step {share}; hottest: f at x.py:17",
            "evidence": {"python_share": 0.4, "where": "x.py:17"}}]}
    assert _expectation(rep("(2 of 3.41 ms)")) == _expectation(rep("(12.5 of 30 ms)"))
    assert _expectation(rep("(2 of 3.41 ms)"))["findings"][0]["evidence"] == {"where": "x.py:17"}


def test_how_far_a_killed_rank_got_is_not_expected():
    """dist/mismatch.py's golden differed between two regens on one box: rank 0 dies by SIGABRT
    after the mismatched collective, having reported 0 or 3 steps. Its expectation names the
    collective, the outcome and the findings; the steps each rank reached are metrics, not there."""
    def report(steps0):
        ranks = [{"outcome": "signal", "rank": 0, "signal": "SIGABRT", "steps": steps0}]
        f = {"code": "collective-mismatch", "severity": "error",
             "evidence": {"call": "#3 all_reduce at mismatch.py:27", "steps_done": steps0}}
        return {"status": "crashed", "findings": [f], "metrics": {"run": {"ranks": ranks, "steps": steps0}},
                "skipped": [{"rule": "r", "reason": "no DataLoader was iterated" if steps0 else "x"}]}
    assert _expectation(report(0)) == _expectation(report(3))
    assert _expectation(report(0))["findings"][0]["evidence"] == {"call": "#3 all_reduce at mismatch.py:27"}


def test_a_new_skipped_rule_does_not_change_a_whole_report_golden():
    """issue 31: a new rule that does not apply rewrote tens of goldens through the skipped list."""
    from fixture_runs import normalise

    base = {"status": "ok", "findings": [], "skipped": [{"rule": "a", "reason": "no DataLoader"}]}
    more = {**base, "skipped": base["skipped"] + [{"rule": "new-rule", "reason": "no optimizer"}]}
    assert normalise(base) == normalise(more) == normalise({**base, "skipped": []})
    odd = {**base, "skipped": [{"rule": "a"}]}  # an entry without its reason: a change of the contract
    assert normalise(odd)["skipped"] == [{"rule": "a"}]


def test_the_memory_site_window_is_masked():
    """memory/eval_with_grad.py: the site window opened in one regen and not in the next."""
    from fixture_runs import normalise

    a = {"status": "ok", "findings": [], "metrics": {"memory": {"sites": {"reason": "heap"}, "x": 1}}}
    b = {"status": "ok", "findings": [], "metrics": {"memory": {"x": 1}}}
    assert normalise(a) == normalise(b)


def test_a_memory_growth_impact_is_masked():
    """memory/leak_loss_graph.py (a contract golden): under load 20 the measured rate no longer
    filled memory within the horizon and the finding gained `impact` (2026-11-28 run)."""
    from fixture_runs import normalise

    def rep(**extra):
        return {"status": "findings", "findings": [{"code": "memory-growth", "severity": "warning",
                                                    "evidence": {"graph_growth": ["x.py:22"], **extra}}]}
    assert normalise(rep(impact="a warning although memory is not full within the horizon")) == normalise(rep())


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


def test_where_a_run_stepping_past_the_clean_stop_was_killed_is_not_expected():
    """proc/swallows_stop.py: killed in its sleep (:19) in one run, in opt.step() (:16) in the next.
    stuck_at / waiting_in are not identifying keys; a real hang's place is its `where`/`call_site`."""
    def rep(line, code):
        return {"status": "timeout", "metrics": {}, "skipped": [], "findings": [{
            "code": "script-hung", "severity": "error",
            "title": f"did not stop; killed after 61 steps at s.py:{line} in <module>",
            "evidence": {"clean_stop_grace_s": 5.0, "stuck_at": f"s.py:{line} in <module>",
                         "waiting_in": f"s.py:{line} in <module>", "code": code, "steps_done": 61}}]}
    assert _expectation(rep(19, "time.sleep(0.2)")) == _expectation(rep(16, "opt.step()"))


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
