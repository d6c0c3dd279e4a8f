"""torchdoctor compile end to end on the healthy compiled CNN (its JSON is timing: no golden).

One run, the header's: backend inductor (dynamo + AOT autograd + the system C++ compiler; the
suite's only CPU inductor run, tens of seconds on a 2-core box). Every backend takes the same
dynamo code path (the backend only changes how long a compile step takes; the other compile
fixtures use eager); this run also shows that inductor's compile time is reported apart."""

from __future__ import annotations

import pytest

from fixture_runs import run_fixture

HEALTHY = "compile/healthy_cnn.py"
COMMAND = "compile --steps 8 -- --backend inductor"


def check_healthy(report: dict) -> dict:
    bad = [(f["code"], f["severity"]) for f in report["findings"]
           if f["severity"] != "info" and f["code"] != "cpu-oversubscribed"]
    assert not bad, report["findings"]
    m = report["metrics"]["compile"]
    assert m["compiled"] and m["graphs"] == 1 and m["graph_breaks"] == 0
    assert m["recompiles"] == 0 and not m["recompile_limit_hit"]  # torchdoctor's hooks add none
    assert 1 in m["compile_steps"] and m["compile_s"] > 0
    assert m["steady_steps"] >= 5 and m["compiled_step_ms"] > 0
    assert m["eager_step_ms"] > 0 and m["eager_steps"] == m["steady_steps"]
    assert m["speedup"] == pytest.approx(m["eager_step_ms"] / m["compiled_step_ms"], rel=0.01)
    return m


def test_a_healthy_compiled_cnn_raises_no_warning_and_reports_compile_time_and_speed_up():
    run = run_fixture(HEALTHY, COMMAND)
    assert run.returncode == 0
    check_healthy(run.report)


@pytest.mark.slow
def test_inductor_cnn_is_healthy():
    run = run_fixture(HEALTHY, COMMAND)  # the session's one run of the fixture
    assert run.returncode == 0
    m = check_healthy(run.report)
    assert m["compile_s"] > 1.0  # inductor compiles C++: compile time is reported apart
