"""checkup's NaN replay (issue 13, item 8).

checkup's monitor does not watch module outputs (for cost), so a NaN born in a layer first
shows as a non-finite loss. The ``nonfinite-loss`` follow-up replays the script to that step
under the nan probe's instruments (forward watch on, the step checked op by op) and reports
what the replay located — the layer, the op and the user's line — instead; a replay that is
not the same run (an unseeded script) is reported as not reproduced and names nothing.
"""

from __future__ import annotations

import pytest

from fixture_runs import run_fixture
from test_nan_fixtures import SCRIPTS, by_code, codes, judge

from torchdoctor.evidence import Evidence


def _replay_runs(rep):
    return [r for r in rep.metrics.get("followups", []) if r["by"] == "replay_forward_watch"]


def test_checkup_replay_names_the_layer_the_op_and_the_line():
    rep = judge("checkup", SCRIPTS / "nan/log_features.py")
    assert codes(rep) == {"nonfinite-forward"}
    f = by_code(rep, "nonfinite-forward")
    e = f.evidence
    assert e["step"] == 5 and e["module"] == "model.0" and e["module_class"] == "LogCompress"
    assert "output of model.0 (LogCompress)" in f.title
    assert e["op"] == "aten::log"
    assert e["op_line"].endswith("log_features.py:21 in forward")  # `return torch.log(x)`
    assert "torch.log(x)" in e["op_code"]
    assert "replayed the script to step 5" in e["replay"]
    assert not any(x.code == "nonfinite-loss" for x in rep.findings)
    runs = _replay_runs(rep)
    assert len(runs) == 1 and runs[0]["probe"] == "nan" and runs[0]["for"] == "nonfinite-loss"
    assert runs[0]["seconds"] > 0 and runs[0]["steps"] == 5


def test_checkup_replay_says_what_nan_says():
    a = by_code(judge("checkup", SCRIPTS / "nan/log_features.py"), "nonfinite-forward").evidence
    b = by_code(judge("nan", SCRIPTS / "nan/log_features.py"), "nonfinite-forward").evidence
    for k in ("step", "module", "module_class", "forward_source", "outputs", "inputs", "op",
              "op_line", "op_code"):
        assert a[k] == b[k], k


def test_checkup_replay_names_a_division_by_a_zero_variance_row():
    rep = judge("checkup", SCRIPTS / "nan/forward_div.py")
    assert codes(rep) == {"nonfinite-forward"}
    e = by_code(rep, "nonfinite-forward").evidence
    assert e["step"] == 6 and e["module"] == "model.0" and e["module_class"] == "Standardize"
    assert e["op"] == "aten::div" and e["op_line"].endswith("forward_div.py:19 in forward")


def test_checkup_replay_blames_the_loss_code_when_every_layer_was_finite():
    rep = judge("checkup", SCRIPTS / "nan/loss_log.py")
    f = by_code(rep, "nonfinite-loss")
    assert f.evidence["step"] == 4 and "the loss computation made it" in f.title
    assert f.evidence["op"] == "aten::log" and "forward_watch" not in f.evidence
    assert "replay" in f.evidence


def test_checkup_replay_blames_the_data_for_a_nan_input():
    rep = judge("checkup", SCRIPTS / "nan/input_nan.py")
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == 4 and "the data" in f.title
    assert "op" not in f.evidence  # a value that came with the data was made by no op


def test_unseeded_script_is_reported_not_reproduced():
    rep = judge("checkup", SCRIPTS / "nan/log_features_unseeded.py")
    f = by_code(rep, "nonfinite-loss")
    e = f.evidence
    assert e["step"] == 5 and e.get("forward_watch") is False
    assert "not reproduced" in e["replay"] and "the loss of step 1 was" in e["replay"]
    assert "never seeds" in e["replay"]
    assert "op" not in e and "module" not in e  # nothing guessed
    assert len(_replay_runs(rep)) == 1


def test_no_rerun_skips_the_replay():
    rep = judge("checkup", SCRIPTS / "nan/log_features.py", options={"rerun": False})
    f = by_code(rep, "nonfinite-loss")
    assert f.evidence.get("forward_watch") is False and "replay" not in f.evidence
    assert not _replay_runs(rep)


def _numerics(losses, start=1):
    steps = list(range(start, start + len(losses)))
    return {"kind": "numerics", "steps": steps, "opt": [0] * len(steps), "loss": losses,
            "grad_norm": [1.0] * len(steps)}


def test_losses_before_the_bad_step_decide_whether_the_replay_is_the_same_run():
    from torchdoctor.pipeline.followups_nan import _diverged

    first = Evidence.from_events([_numerics([0.7, 0.6, 0.5, "nan"])])
    same = Evidence.from_events([_numerics([0.7, 0.6003, 0.5, "nan"])])  # GPU drift: 5e-4
    other = Evidence.from_events([_numerics([0.7, 0.65, 0.5, "nan"])])
    assert _diverged(first, same, 4) is None
    assert "step 2" in _diverged(first, other, 4)
    assert _diverged(first, other, 2) is None  # only the steps before the bad one count


def test_cli_checkup_json_reports_the_layer_and_the_replay_cost():
    p = run_fixture("nan/log_features.py", "checkup")  # the session's run (tests/test_fixtures.py)
    r = p.report
    assert p.returncode == 1, p.stderr[-2000:]
    f = next(x for x in r["findings"] if x["code"] == "nonfinite-forward")
    assert f["evidence"]["module"] == "model.0" and f["evidence"]["op"] == "aten::log"
    assert f["evidence"]["op_line"].endswith("log_features.py:21 in forward")
    run = next(x for x in r["metrics"]["followups"] if x["by"] == "replay_forward_watch")
    assert run["probe"] == "nan" and run["seconds"] > 0


def test_numerics_section_mentions_the_replay():
    from torchdoctor.findings import Report
    from torchdoctor.report.console import render_to_text

    rep = Report(command="checkup", target="x.py")
    rep.metrics["nan"] = {"forward_watch": False, "check_every": 8, "checked_steps": 5,
                          "series": [[1, 0, 0.5, 1.0], [5, 0, "nan", "nan"]],
                          "first_nonfinite": {"step": 5, "what": "loss", "where": None}}
    rep.metrics["followups"] = [{"for": "nonfinite-loss", "by": "replay_forward_watch",
                                 "probe": "nan", "seconds": 2.25, "outcome": "stopped", "steps": 5}]
    assert "replayed to that step with the forward watch (2.2 s)" in render_to_text(rep, width=200)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_checkup_replay_on_cuda_names_the_layer_and_op(dtype):
    """On CUDA the rows come back asynchronously; the replay still stops at the step and names
    the module and op (as ``nan`` does in test_nan_gpu)."""
    rep = judge("checkup", SCRIPTS / "nan/autocast_div.py", (dtype,))
    assert codes(rep) == {"nonfinite-forward"}, [(f.code, f.title) for f in rep.findings]
    e = by_code(rep, "nonfinite-forward").evidence
    assert e["step"] == 6 and e["module"] == "model.1" and e["op"] == "aten::div"
    assert "replay" in e and _replay_runs(rep)[0]["seconds"] > 0
