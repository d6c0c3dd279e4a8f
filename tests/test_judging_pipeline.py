"""The one judge pipeline (pipeline/judging.py): stages guarded, follow-ups never dropped silently."""

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report, finding
from torchdoctor.pipeline.judging import followups, judge_run


def test_followups_without_relaunch_are_listed_as_skipped_not_dropped():
    # a ranked run has no relaunch: before, its follow-ups vanished without a word
    report = Report(command="nan")
    report.add(finding("inplace-modified", "a tensor needed for gradient was modified in place"))
    followups(report, Evidence(), None)
    skipped = [s for s in report.skipped if s.rule.startswith("followup:")]
    assert skipped and "inplace-modified" in skipped[0].reason and "torchrun" in skipped[0].reason
    assert [f.code for f in report.findings] == ["inplace-modified"]


def test_followups_with_relaunch_run_and_are_timed():
    report = Report(command="nan")
    report.add(finding("inplace-modified", "modified in place"))
    calls = []

    def relaunch(extra, probe=None):
        calls.append((extra, probe))
        return Evidence.from_events([], result={"outcome": "crash", "steps": 1})

    followups(report, Evidence.from_events([], meta={"probe": "nan"}, result={"steps": 1}), relaunch)
    assert calls, "the follow-up did not re-run"
    assert report.metrics["followups"][0]["for"] == "inplace-modified"
    assert not any(s.rule.startswith("followup:") for s in report.skipped)


def test_a_crashing_metrics_provider_is_an_internal_error_and_the_rest_stands(monkeypatch):
    from torchdoctor.pipeline import registry

    def boom(ev):
        raise ZeroDivisionError("x")

    providers = {**registry.metrics_providers(), "zz_boom": boom}
    monkeypatch.setattr(registry, "metrics_providers", lambda: providers)
    ev = Evidence.from_events([{"kind": "step", "step": 1, "wall_s": 0.1}],
                              result={"outcome": "exit", "exit_code": 0, "steps": 1})
    report = judge_run("run", ev, target="train.py")
    assert [f.code for f in report.findings if f.code == "internal-error"] == ["internal-error"]
    assert "metrics zz_boom failed" in report.findings[-1].title
    assert report.exit_code() == 0  # internal-error is a warning: the run's own verdict stands


def test_a_crashing_run_rule_is_an_internal_error_and_the_other_rules_still_judge(monkeypatch):
    from torchdoctor import judge as J

    J.load_rules()

    def broken(ev):
        raise KeyError("\x1b[31mdepth")

    monkeypatch.setitem(J._RULES, "aa-broken", J.Rule("aa-broken", frozenset({"run"}),
                                                     frozenset(), frozenset(), broken))
    ev = Evidence.from_events([], result={"outcome": "crash", "exit_code": 1, "steps": 0,
                                          "exception": {"type": "ValueError", "message": "bad",
                                                        "traceback": []}})
    report = judge_run("run", ev, target="train.py")
    codes = sorted(f.code for f in report.findings)
    assert "internal-error" in codes and "script-crashed" in codes, codes
    bad = next(f for f in report.findings if f.code == "internal-error")
    assert bad.evidence["rule"] == "aa-broken" and "\x1b" not in bad.title + bad.evidence["traceback"]
    assert report.exit_code() == 1  # script-crashed is an error: exit 1 as without the bug
