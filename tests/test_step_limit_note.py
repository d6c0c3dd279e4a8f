"""The report says when the run was cut by the ``--steps`` limit (issue 13, item 14).

Only when the limit ended the run: not when the script ended on its own before it, nor when an
instrument (the nan probe's first non-finite value), the timeout or a crash ended it.
"""

from __future__ import annotations

from conftest import ROOT, run_cli
from fixture_runs import run_fixture
from test_nan_fixtures import SCRIPTS, run_inprocess

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.pipeline.judging import step_limit as _step_limit, step_limit_cut
from torchdoctor.report.console import render_to_text

HEALTHY = ROOT / "tests" / "fixtures" / "scripts" / "run"


def _report(ev: Evidence) -> Report:
    rep = Report(command="checkup", target="x.py")
    rep.metrics["run"] = {"outcome": ev.result.get("outcome")}
    _step_limit(ev, rep)
    return rep


def test_the_runners_stop_reason_is_recognised():
    """The reason comes from the real harness core: a change to its wording must fail here."""
    ev = run_inprocess("run", SCRIPTS / "nan/healthy_mlp.py", options={"steps": 7})
    assert ev.result["outcome"] == "stopped" and step_limit_cut(ev) == 7
    rep = _report(ev)
    assert rep.metrics["run"]["stopped_by"] == "steps"
    assert rep.metrics["run"]["step_limit"] == 7
    assert rep.metrics["run"]["step_limit_default"] is False


def test_a_script_that_ends_before_the_limit_gets_no_note():
    ev = run_inprocess("run", SCRIPTS / "nan/healthy_mlp.py", options={"steps": 50})  # 40 steps
    assert ev.result["outcome"] == "exit" and step_limit_cut(ev) is None
    rep = _report(ev)
    assert "stopped_by" not in rep.metrics["run"]
    assert "Stopped after" not in render_to_text(rep)


def test_other_stops_get_no_note():
    for result in ({"outcome": "stopped", "reason": "--timeout reached", "steps": 9},
                   {"outcome": "stopped", "reason": "first non-finite value found at step 6"},
                   {"outcome": "crash", "steps": 3}, {"outcome": "timeout"},
                   {"outcome": "interrupted", "steps": 50}):
        assert step_limit_cut(Evidence.from_events([], result=result)) is None, result


def test_nan_probe_stop_at_the_first_nonfinite_value_is_not_the_step_limit():
    ev = run_inprocess("nan", SCRIPTS / "nan/forward_div.py", options={"steps": 6, "rerun": False})
    assert ev.result["steps"] == 6 and step_limit_cut(ev) is None  # nan stopped it first


def test_cli_default_limit_is_said_in_the_console_and_the_json():
    p = run_cli("checkup", "healthy.py", "--epochs", "4", cwd=HEALTHY, timeout=180)  # 64 steps
    assert p.returncode == 0, p.stderr[-2000:]
    assert ("Stopped after 50 steps (the default --steps), not at the end of the script; "
            "run longer with --steps N (0: no limit)") in p.stdout
    # a limit given on the command line: the session's run of run/healthy.py (its header's
    # --steps 10 cuts its 16 steps; a --json run of its own cost a torch process)
    run = run_fixture("run/healthy.py", "checkup --steps 10 -- --epochs 1 --echo {tmp}/echo.txt"
                      ).report["metrics"]["run"]
    assert run["stopped_by"] == "steps" and run["step_limit"] == 10
    assert run["step_limit_default"] is False


def test_the_default_is_the_commands_own_default_not_always_50():
    # regression: `torchdoctor profile` (default --steps 20) said "the --steps limit" when its
    # own default had cut the run, because the check compared with the script probes' 50
    report = Report(command="profile")
    ev = Evidence.from_events([], meta={"options": {"steps": 20, "steps_default": 20}},
                              result={"outcome": "stopped", "reason": "--steps 20 reached"})
    _step_limit(ev, report)
    assert report.metrics["run"]["step_limit_default"] is True
    ev = Evidence.from_events([], meta={"options": {"steps": 50, "steps_default": 20}},
                              result={"outcome": "stopped", "reason": "--steps 50 reached"})
    report = Report(command="profile")
    _step_limit(ev, report)
    assert report.metrics["run"]["step_limit_default"] is False
