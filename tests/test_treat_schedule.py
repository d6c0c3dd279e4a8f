"""treat's schedule on fake runs (no child process): the order of the rounds, a failed trial not
repeated, the combined trial, the budget and Ctrl-C stopping it."""

from __future__ import annotations

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.treat.plan import Plan, Planned
from torchdoctor.treat.session import BASE, TreatSession
from torchdoctor.trials import TrialRun

MS = {"baseline": 20.0, "dataloader-workers": 10.0, "set-to-none": 16.0, "combined": 8.0}


class FakeTrials:
    """Answers each run from the variation's name: step times from MS, a crash for "crash"."""

    def __init__(self, budget_runs: int | None = None, interrupt_at: int | None = None):
        self.runs: list[TrialRun] = []
        self.order: list[str] = []
        self.budget_runs, self.interrupt_at = budget_runs, interrupt_at

    def remaining_s(self):
        return None if self.budget_runs is None else 100.0 * (self.budget_runs - len(self.order))

    def expired(self):
        return self.budget_runs is not None and len(self.order) >= self.budget_runs

    def run(self, v, round=0, probe=None):
        self.order.append(v.name)
        names = [t["name"] for t in v.options.get("treatment", [])]
        ms = MS["combined"] if len(names) > 1 else MS.get(v.name, 20.0)
        result = {"outcome": "stopped"}
        if self.interrupt_at is not None and len(self.order) == self.interrupt_at:
            result = {"outcome": "interrupted", "interrupted": True}
        events = [{"kind": "step", "step": i, "wall_s": ms / 1e3, "data_s": 0.0} for i in range(1, 7)]
        events.append({"kind": "loss_trace", "steps": [1, 2, 3], "losses": [3.0, 2.0, 1.0]})
        events.append({"kind": "peak_memory", "host_rss": 2**27})
        if "crash" in names:
            result = {"outcome": "crash", "exception": {"type": "RuntimeError", "message": "boom"}}
        events.append({"kind": "treatment", "applied": [
            {"name": n, "changes": [{"what": "x", "where": "t.py:1", "code": "c"}]} for n in names]})
        r = TrialRun(v, round, Evidence.from_events(events, meta={"argv": ["t.py"]}, result=result), 100.0)
        self.runs.append(r)
        return r


def _session():
    s = TreatSession("t.py", [], {}, budget_s=None, forced=None, rounds=2, progress=lambda m: None)
    s.est_s = 100.0
    return s


def _plan(*names):
    return Plan(trials=[Planned(n, None, "test") for n in names])


@pytest.fixture()
def crash_applier(monkeypatch):
    from torchdoctor.treat import catalogue

    t = catalogue.Treatment("crash", "optim", "raises", "never")
    monkeypatch.setitem(catalogue.BY_NAME, "crash", t)


def test_rounds_alternate_reverse_and_the_adopted_ones_run_combined():
    tr, s = FakeTrials(), _session()
    entries = s._schedule(tr, tr.run(BASE), _plan("dataloader-workers", "set-to-none"), {}, False)
    assert tr.order == ["baseline", "dataloader-workers", "set-to-none",
                        "baseline", "set-to-none", "dataloader-workers",
                        "combined", "baseline", "combined"]
    by = {e["name"]: e for e in entries}
    assert by["dataloader-workers"]["verdict"] == "adopt" and by["set-to-none"]["verdict"] == "adopt"
    c = by["combined"]
    assert c["combines"] == ["dataloader-workers", "set-to-none"] and c["speedup"] == 2.5
    assert c["rounds"] == {"baseline": 3, "treated": 2}


def test_a_failed_trial_is_not_run_again_and_the_others_go_on(crash_applier):
    tr, s = FakeTrials(), _session()
    entries = s._schedule(tr, tr.run(BASE), _plan("crash", "dataloader-workers"), {}, False)
    assert tr.order == ["baseline", "crash", "dataloader-workers", "baseline", "dataloader-workers"]
    by = {e["name"]: e for e in entries}
    assert by["crash"]["verdict"] == "failed" and by["crash"]["error"].startswith("RuntimeError: boom")
    assert by["dataloader-workers"]["verdict"] == "adopt"


def test_the_budget_stops_before_a_run_and_lists_what_did_not_run():
    tr, s = FakeTrials(budget_runs=3), _session()
    entries = s._schedule(tr, tr.run(BASE), _plan("dataloader-workers", "set-to-none"), {}, False)
    assert tr.order == ["baseline", "dataloader-workers", "set-to-none"] and s.stopped == "budget"
    by = {e["name"]: e for e in entries}
    assert by["dataloader-workers"]["rounds"] == {"baseline": 1, "treated": 1}
    assert "combined" not in by  # no combined trial once stopped


def test_ctrl_c_in_a_run_starts_no_other_run():
    tr, s = FakeTrials(interrupt_at=3), _session()
    entries = s._schedule(tr, tr.run(BASE), _plan("dataloader-workers", "set-to-none"), {}, False)
    assert tr.order == ["baseline", "dataloader-workers", "set-to-none"] and s.stopped == "interrupted"
    by = {e["name"]: e for e in entries}
    assert by["set-to-none"]["verdict"] == "skipped"
    assert by["set-to-none"]["reason"] == "not run: interrupted (Ctrl-C)"
    assert len(tr.runs) == 2  # the interrupted run is dropped
