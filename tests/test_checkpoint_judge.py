"""The checkpoint rules on the one rule contract (torchdoctor/judge.py): pure, guarded, order-free.

A crashing rule is one ``internal-error`` finding and the rest of the report stands, with the exit
code of the contract (1 only for an error finding, or a warning under --fail-on warning); a crash
while deriving a fact is an ``internal-error`` too, and the rules that need the fact say they
could not judge. The report lists findings and skips in the audit's reading order, whatever the
rules' names.
"""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torchdoctor import judge
from torchdoctor.pipeline.checkpoint import READING_ORDER, Options, run
from torchdoctor.cli import app

HERE = Path(__file__).resolve().parent


def _builders():
    spec = importlib.util.spec_from_file_location("ckpt_builders", HERE / "fixtures" / "checkpoint" / "builders.py")
    import sys

    if "ckpt_builders" not in sys.modules:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ckpt_builders"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["ckpt_builders"]


@pytest.fixture(scope="module")
def fx():
    return _builders().cached("all")


def _break(monkeypatch, name: str) -> None:
    """Replace registered rule ``name`` with one that crashes as odd input can make a rule crash."""
    judge.load_rules()

    def broken(ev):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setitem(judge._RULES, name, dataclasses.replace(judge._RULES[name], fn=broken))


def _cli(*args):
    return CliRunner().invoke(app, ["checkpoint-audit", *map(str, args)])


def test_every_checkpoint_rule_is_registered_and_placed():
    names = {r.name for r in judge.rules_for("checkpoint-audit")}
    assert names == set(READING_ORDER)
    codes = {c for r in judge.rules_for("checkpoint-audit") for c in r.raises}
    from torchdoctor.catalog import catalog

    assert codes == {c for c in catalog() if c.startswith("ckpt-")}


def test_a_crashing_rule_is_an_internal_finding_and_the_rest_stands(monkeypatch, fx):
    _break(monkeypatch, "ckpt-device-tensors")
    rep = run(fx["nonfinite"], Options())
    codes = {f.code: f.severity for f in rep.findings}
    assert codes == {"internal-error": "warning", "ckpt-nonfinite-weights": "error"}
    crash = next(f for f in rep.findings if f.code == "internal-error")
    assert crash.evidence["rule"] == "ckpt-device-tensors" and "RecursionError" in crash.title
    assert rep.metrics["checkpoint"]["judged_as"] == "resume"


def test_a_crashing_rule_through_the_cli_keeps_the_report_and_the_exit_code(monkeypatch, fx):
    _break(monkeypatch, "ckpt-unsafe-pickle")
    ok = _cli(fx["complete"], "--json")
    out = json.loads(ok.stdout)
    assert ok.exit_code == 0, ok.output  # internal-error is a warning: not a failure under --fail-on error
    assert [f["code"] for f in out["findings"]] == ["internal-error"]
    assert out["findings"][0]["evidence"]["rule"] == "ckpt-unsafe-pickle"
    assert out["metrics"]["checkpoint"]["roles"]["optimizer"]  # the rest of the report stands
    assert [s["rule"] for s in out["skipped"]] == ["ckpt-model-mismatch"]
    assert _cli(fx["complete"], "--json", "--fail-on", "warning").exit_code == 1
    bad = _cli(fx["nonfinite"], "--json")
    assert bad.exit_code == 1
    assert {f["code"] for f in json.loads(bad.stdout)["findings"]} == {"internal-error", "ckpt-nonfinite-weights"}


def test_every_checkpoint_rule_crashing_leaves_a_report(monkeypatch, fx):
    for r in judge.rules_for("checkpoint-audit"):
        _break(monkeypatch, r.name)
    res = _cli(fx["nonfinite"], "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and "Traceback" not in res.stderr
    assert [f["evidence"]["rule"] for f in out["findings"]] == list(READING_ORDER)
    assert out["metrics"]["checkpoint"]["format"] == "torch-zip"


def test_a_crashing_derivation_is_an_internal_finding_and_its_rule_skips(monkeypatch, fx):
    from torchdoctor.checkpoint import derive

    def broken(ev):
        raise ValueError("odd optimizer state")

    monkeypatch.setattr(derive, "_optimizer_fit", broken)
    rep = run(fx["optimizer_mismatch"], Options())
    crash = next(f for f in rep.findings if f.code == "internal-error")
    assert "derive optimizer fit" in crash.title
    skip = {s.rule: s.reason for s in rep.skipped}
    assert "deriving the optimizer fit failed" in skip["ckpt-optimizer-mismatch"]
    assert "optimizer_vs_params" not in rep.metrics["checkpoint"].get("facts", {})


def test_findings_and_skips_keep_the_reading_order_not_the_rule_names(fx):
    # by rule name, missing-rng would come before missing-scheduler (both info here)
    rep = run(fx["weights_with_epoch"], Options())
    assert [f.code for f in rep.sorted_findings()] == ["ckpt-missing-optimizer", "ckpt-missing-scheduler",
                                                       "ckpt-missing-rng"]
    # by rule name, progress/rng/scaler would come before scheduler
    weights = run(fx["weights_state_dict"], Options())
    assert [s.rule for s in weights.skipped] == ["ckpt-missing-optimizer", "ckpt-missing-scheduler",
                                                 "ckpt-missing-rng", "ckpt-missing-progress", "ckpt-missing-scaler",
                                                 "ckpt-model-mismatch", "ckpt-optimizer-mismatch"]


def test_rules_are_pure_functions_of_the_evidence(fx):
    """Judging the same evidence twice, or one rule alone, gives the same findings: no shared state."""
    from torchdoctor.pipeline.checkpoint import _judged
    from torchdoctor.checkpoint.derive import derive
    from torchdoctor.checkpoint.reader import read
    from torchdoctor.checkpoint.evidence import CheckpointEvidence
    from torchdoctor.checkpoint.roles import recognise
    from torchdoctor.checkpoint.scan import scan_tensors
    from torchdoctor.checkpoint.walk import iter_tensors

    c = read(fx["ddp_prefix"])
    ev = CheckpointEvidence(c, recognise(c.root), scan=scan_tensors(list(iter_tensors(c.root))))
    derive(ev, lambda name, fn: fn())
    whole = [(f.code, f.title) for f in _judged(ev).findings]
    alone = [(f.code, f.title) for name in READING_ORDER for f in _judged(ev, only={name}).findings]
    assert whole == alone == [(f.code, f.title) for f in _judged(ev).findings]
    assert [c for c, _t in whole] == ["ckpt-wrapper-prefix"]


def test_a_crashing_safety_rule_on_an_unreadable_file_keeps_the_unreadable_finding(monkeypatch, tmp_path):
    """The safety judgment of what was scanned before a failure goes through the same guarded judge."""
    spec = importlib.util.spec_from_file_location("ckpt_hostile_judge", HERE / "fixtures" / "checkpoint" / "hostile.py")
    hostile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hostile)
    truncated_system = hostile.truncated_system
    p = tmp_path / "t.pkl"
    p.write_bytes(truncated_system(str(tmp_path / "MARKER")))
    assert {f.code: f.severity for f in run(str(p), Options()).findings} == {
        "ckpt-unreadable": "error", "ckpt-unsafe-pickle": "error"}
    _break(monkeypatch, "ckpt-unsafe-pickle")
    res = _cli(p, "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 1
    assert {f["code"] for f in out["findings"]} == {"ckpt-unreadable", "internal-error"}
    assert not (tmp_path / "MARKER").exists()
