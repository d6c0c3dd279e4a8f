"""How a run ended, said honestly (issue 14 item 14, issue 13 item 15): a run killed at the
timeout is not "no problems" with exit 0; an interrupted run is not "ok"; torchdoctor options
written after SCRIPT are named as such."""

from __future__ import annotations

import pytest

from conftest import ROOT
from fixture_runs import run_fixture
from torchdoctor.findings import Report, finding
from torchdoctor.report.console import render_to_text


@pytest.mark.slow
def test_a_run_killed_at_the_timeout_after_ignoring_the_clean_stop_is_an_error(tmp_path):
    p = run_fixture("proc/swallows_stop.py", "checkup --timeout 12 --steps 0")  # the session's run
    r = p.report
    assert r["status"] == "timeout" and p.returncode == 1, (p.returncode, r["findings"])
    hung = [f for f in r["findings"] if f["code"] == "script-hung"]
    assert hung and "did not stop at a step boundary" in hung[0]["title"]
    assert "swallows_stop.py" in hung[0]["title"]
    assert r["metrics"]["run"]["clean_stop_requested"] is True


@pytest.mark.slow
def test_torchdoctor_option_after_the_script_is_named():
    r = run_fixture("proc/argparse_train.py", "checkup -- --epochs 1 --steps 3").report  # the session's run
    f = [f for f in r["findings"] if f["code"] == "script-crashed"]
    assert f, r["findings"]
    assert "refused --steps" in f[0]["title"] and "before SCRIPT" in f[0]["title"]
    assert f[0]["evidence"]["refused_options"] == ["--steps"]
    assert "torchdoctor checkup --steps" in f[0]["fix"]


def test_misplaced_options_needs_the_parsers_refusal():
    from torchdoctor.rules.misplaced import misplaced_options

    res = {"outcome": "exit", "exit_code": 2,
           "output_tail": ["usage: main.py [-h] [--epochs EPOCHS]",
                           "main.py: error: unrecognized arguments: --json --out o"]}
    assert misplaced_options(res, ["--epochs", "1", "--json", "--out", "o"]) == ["--json", "--out"]
    assert misplaced_options({**res, "exit_code": 1}, ["--json"]) == []
    assert misplaced_options({**res, "output_tail": ["bad value"]}, ["--json"]) == []


def test_the_option_list_is_read_from_the_cli():
    from torchdoctor.rules.misplaced import torchdoctor_options

    known = torchdoctor_options()
    assert {"--json", "--steps", "--timeout", "--out", "--fail-on", "--nproc-per-node"} <= known
    assert "--skip" in known  # profile's own option, without any list to keep in step
    assert "--help" not in known


def _report(status: str | None, run: dict, findings=()) -> str:
    r = Report(command="checkup", target="train.py", run_status=status)
    r.metrics["run"] = run
    r.findings.extend(findings)
    return " ".join(render_to_text(r).split())


def test_console_footer_says_how_the_run_ended():
    text = _report("interrupted", {"outcome": "interrupted", "interrupted_by": "SIGTERM", "steps": 3})
    assert "Run interrupted by SIGTERM after 3 steps" in text
    assert "✓" not in text and "No problems found in what ran" in text
    text = _report("interrupted", {"outcome": "interrupted", "interrupted_by": "SIGINT", "steps": 1})
    assert "Run interrupted by Ctrl-C (SIGINT) after 1 step:" in text
    hung = finding("script-hung", "no progress", {})
    text = _report("timeout", {"outcome": "timeout", "timeout_s": 8.0, "steps": 4}, [hung])
    assert "Run killed at the --timeout (8 s) after 4 steps" in text and "1 finding" in text
    text = _report(None, {"outcome": "stopped", "reason": "--timeout reached", "timeout_s": 5,
                          "steps": 9})
    assert "Run stopped cleanly at the --timeout (5 s) after 9 steps." in text
    assert "✓ No problems found" in text
    assert "Run " not in _report(None, {"outcome": "exit", "steps": 9})


def test_interrupted_report_exit_code_and_json_status():
    r = Report(command="checkup", run_status="interrupted")
    assert r.exit_code() == 130 and r.to_dict()["status"] == "interrupted"


def test_hang_evidence_leaves_out_torchdoctors_own_threads(tmp_path):
    import threading

    from torchdoctor.rules.run import stack_evidence

    thr = threading.__file__
    pkg = str(ROOT / "torchdoctor" / "runner")
    script = str(tmp_path / "train.py")
    stacks = {"threads": [
        {"id": "1", "name": None, "current": True,
         "frames": [[script, 5, "<module>"], [f"{pkg}/harness.py", 10, "main"]]},
        {"id": "2", "name": None, "current": False,
         "frames": [[f"{pkg}/lifeline.py", 108, "_watch"], [thr, 982, "run"]]},
        {"id": "3", "name": None, "current": False,
         "frames": [[f"{pkg}/rundir.py", 99, "_run"], [thr, 982, "run"]]},
        {"id": "4", "name": None, "current": False, "frames": [[script, 9, "worker"]]}]}
    ev = stack_evidence(stacks)
    assert len(ev["other_threads"]) == 1 and "worker" in ev["other_threads"][0]
