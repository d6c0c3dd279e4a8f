"""`torchdoctor profile` end to end on the CPU fixture scripts (fresh processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixture_runs import run_fixture

SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts" / "profile"
PROFILE_CODES = {"host-sync-in-loop", "launch-bound", "pageable-h2d-copy", "fp32-compute-bound",
                 "slow-python-loop"}
# a loaded CI host can make the step clock's cpu-oversubscribed rule fire on any script: it is
# measured, not a false alarm, and it is not this probe's finding
NOISE = {"cpu-oversubscribed"}


def _profile(cli, script, *opts):
    p = cli("profile", "--json", *opts, SCRIPTS / script)
    assert p.stdout.strip(), p.stderr
    return p, json.loads(p.stdout)


def test_slow_python_loop_is_found_with_the_hot_function():
    p = run_fixture("profile/cpu_slow_python.py", "profile --out {tmp}")  # the session's run
    rep, tmp_path = p.report, p.tmp
    assert p.returncode == 0, p.stderr  # info only
    codes = {f["code"] for f in rep["findings"]} - NOISE
    assert codes == {"slow-python-loop"}
    (f,) = [f for f in rep["findings"] if f["code"] == "slow-python-loop"]
    assert f["severity"] == "info" and "cpu_slow_python.py:" in f["title"]
    assert f["evidence"]["python_share"] >= 0.5
    skipped = {s["rule"]: s["reason"] for s in rep["skipped"]}
    for rule in ("host-sync-in-loop", "launch-bound", "pageable-h2d-copy", "fp32-compute-bound"):
        assert skipped[rule] in ("needs CUDA", "no GPU work in the profiled steps")
    m = rep["metrics"]["profile"]
    assert m["status"] == "ok" and m["steps"] == [7, 8, 9]
    assert m["top_ops"] and m["python_hotspots"][0]["def"].endswith("cpu_slow_python.py:17")
    trace = Path(rep["artifacts"]["trace"])
    assert trace == tmp_path.resolve() / "trace.json" and json.loads(trace.read_text())["traceEvents"]
    assert "profiler_start" not in p.stderr and "Profiler clears events" not in p.stderr
    text = (tmp_path / "report.txt").read_text()
    assert "Profiler window: steps 7–9 recorded" in text and "Top ops by self CPU time" in text


def test_a_script_with_its_own_profiler_is_not_misread():
    rep = run_fixture("profile/cpu_own_profiler.py", "profile").report  # the session's run
    assert {f["code"] for f in rep["findings"]} - NOISE == set()
    assert rep["metrics"]["profile"]["steps"] == [7, 8, 9]


def test_window_beyond_the_run_is_reported_not_judged(cli):
    p, rep = _profile(cli, "cpu_healthy.py", "--steps", "4", "--skip", "10")
    skipped = {s["rule"]: s["reason"] for s in rep["skipped"]}
    assert "needs 14" in skipped["slow-python-loop"]
    assert rep["metrics"]["profile"]["status"] == "not-reached"


def test_missing_script_is_a_usage_error(cli_inproc, tmp_path):
    p = cli_inproc("profile", tmp_path / "nope.py")
    assert p.returncode == 2
    assert "script not found" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("flag,value", [("--window", "0"), ("--skip", "-1")])
def test_bad_window_options_are_usage_errors(cli_inproc, flag, value):
    p = cli_inproc("profile", flag, value, SCRIPTS / "cpu_healthy.py")  # the run is forbidden
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr


def test_an_empty_window_says_what_happened_not_another_profiler():
    """Issue 27 item 11: mnist_forward_forward's window was empty and the hint blamed another
    torch.profiler; its steps had ended together when the optimizers' cycle was learned."""
    rep = run_fixture("profile/cpu_layerwise_optimizers.py", "profile").report
    prof = rep["metrics"]["profile"]
    assert prof["status"] == "empty", prof
    assert "ended together" in prof["reason"] and "--skip" in prof["reason"], prof["reason"]
    assert "own torch.profiler" not in prof["reason"]


def test_a_window_not_reached_says_whether_any_optimizer_stepped():
    from torchdoctor.evidence.profile import not_reached

    base = {"status": "not-reached", "steps_needed": 9}
    assert "no optimizer step was seen" in not_reached({**base, "steps_seen": 0, "optimizers_stepped": 0})
    assert "2 optimizers stepped but no training step" in not_reached({**base, "steps_seen": 0,
                                                                        "optimizers_stepped": 2})
    assert "completed 4 training steps" in not_reached({**base, "steps_seen": 4})
