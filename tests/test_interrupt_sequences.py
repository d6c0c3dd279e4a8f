"""Multi-run commands stop at the first stop signal (issue 28, item 8).

``repro``, ``treat`` and ``compile``'s eager comparison run the script several times. A Ctrl-C,
SIGTERM or SIGHUP must stop the sequence wherever it lands (inside a run, or in the parent between
two runs), and the report of what ran must be printed with status ``interrupted``, exit 130.
Before the fix a signal between runs unwound the command (exit 130, no report), and a signal
inside a run let the next runs start (SIGTERM at 8 s: three more runs, exit 0).

Here the runs are fakes (``launch`` replaced: evidence files written, no child), and the signal is
a real one sent to this process at a chosen point: between runs, or noted by an interrupted run as
the launcher does. The real launcher is exercised end to end in ``test_interrupt_e2e.py``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torchdoctor.runner import signals
from torchdoctor.runner.launch import LaunchResult
from torchdoctor.runner.rundir import EVENTS, META, RESULT

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
STEPS = 4


class FakeLaunch:
    """``launch`` without a child: writes a finished run's evidence; ``at=(n, how)``: the n-th
    launch (1-based) ends with a stop signal, ``how`` = "between" (delivered to this process
    after the run, while the parent goes on) or "inside" (the run was interrupted: what the real
    launcher records)."""

    def __init__(self, sig: int, at: tuple[int, str] | None, diverge: bool = False):
        self.sig, self.at, self.diverge = sig, at, diverge
        self.calls: list[str] = []

    def __call__(self, run_dir, probe, argv, *, options=None, **_kw) -> LaunchResult:
        signals.check()  # as the real launcher: nothing starts once a stop was recorded
        options = options.wire() if hasattr(options, "wire") else dict(options or {})  # as launch does
        self.calls.append(str(options.get("trial") or probe))
        n = len(self.calls)
        d = Path(run_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / META).write_text(json.dumps({"probe": probe, "argv": argv, "options": options, "needs": []}))
        steps = int(options.get("steps") or STEPS)
        run_b = options.get("trial") == "run-b"
        events = []
        for s in range(1, steps + 1):
            events.append({"kind": "step", "step": s, "wall_s": 0.01, "t": s * 0.01})
            value = 1.0 + s + (0.5 if (self.diverge and run_b) else 0.0)
            events.append({"kind": "fingerprint", "step": s, "kinds": {"loss": [["loss", value, value, value]]}})
        events.append({"kind": "loss_trace", "steps": list(range(1, steps + 1)),
                       "losses": [1.0 + s + (0.5 if (self.diverge and run_b) else 0.0) for s in range(1, steps + 1)]})
        events.append({"kind": "treat_survey", "zero_grad_false": True})  # treat: set-to-none applies
        (d / EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
        result = {"outcome": "stopped", "reason": f"--steps {steps} reached", "steps": steps}
        inside = self.at is not None and n == self.at[0] and self.at[1] == "inside"
        if inside:
            name = signal.Signals(self.sig).name
            result = {"outcome": "interrupted", "interrupted": True, "interrupted_by": name, "steps": 2,
                      "child_outcome": "exit"}
            signals.note_stop(name)
        (d / RESULT).write_text(json.dumps(result))
        if self.at is not None and n == self.at[0] and self.at[1] == "between":
            os.kill(os.getpid(), self.sig)  # lands in the parent, after the run, before the next
        return LaunchResult(outcome=result["outcome"], returncode=0, wall_s=0.05, result=result)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text("print('never run: launch is a fake')\n")
    return p


def _invoke(monkeypatch, fake: FakeLaunch, argv: list[str]):
    from torchdoctor.cli import app

    monkeypatch.setattr("torchdoctor.runner.launch.launch", fake)
    monkeypatch.setenv("COLUMNS", "120")
    res = CliRunner().invoke(app, argv)
    assert signals.stopped() is None  # the command's scope is gone with it
    return res


def _json(res) -> dict:
    assert res.stdout.strip(), (res.exit_code, res.stderr[-2000:])
    return json.loads(res.stdout)


# ------------------------------------------------------------------------------------- repro

@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("at, runs, reason", [
    ((1, "between"), 1, "before both runs finished"),  # after run A, before run B
    ((1, "inside"), 1, "before both runs finished"),  # run A interrupted: B never starts
    ((2, "inside"), 2, "before both runs finished"),  # run B interrupted
])
def test_repro_stops_at_the_first_signal_and_reports(monkeypatch, script, sig, at, runs, reason):
    fake = FakeLaunch(sig, at)
    res = _invoke(monkeypatch, fake, ["repro", "--json", "--steps", str(STEPS), str(script)])
    assert res.exit_code == 130, res.stderr[-2000:]
    rep = _json(res)
    assert rep["status"] == "interrupted"
    assert len(fake.calls) == runs, fake.calls
    assert reason in rep["metrics"]["repro"]["reason"]
    assert not any(f["code"] == "internal-error" for f in rep["findings"]), rep["findings"]


@pytest.mark.parametrize("sig", SIGNALS)
def test_repro_signal_before_the_localising_pair_keeps_the_divergence(monkeypatch, script, sig):
    fake = FakeLaunch(sig, (2, "between"), diverge=True)
    res = _invoke(monkeypatch, fake, ["repro", "--json", "--steps", str(STEPS), str(script)])
    assert res.exit_code == 130, res.stderr[-2000:]
    rep = _json(res)
    assert fake.calls == ["run-a", "run-b"]  # no localising pair
    data = rep["metrics"]["repro"]
    assert data["compared"] is True and data["first_divergent_step"] == 1
    assert data["first_divergent_op"] == {"kind": "unavailable",
                                          "reason": f"interrupted by {signal.Signals(sig).name}"}
    assert rep["status"] == "interrupted"


def test_repro_without_a_signal_runs_its_sequence(monkeypatch, script):
    """The control: the same fakes, no signal: both runs, compared, exit 0."""
    fake = FakeLaunch(signal.SIGTERM, None)
    res = _invoke(monkeypatch, fake, ["repro", "--json", "--steps", str(STEPS), str(script)])
    assert res.exit_code == 0, res.stderr[-2000:]
    rep = _json(res)
    assert fake.calls == ["run-a", "run-b"] and rep["status"] == "ok"
    assert rep["metrics"]["repro"]["identical"] is True


# ------------------------------------------------------------------------------------- treat

@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("at, runs", [((1, "between"), 1), ((2, "between"), 2), ((2, "inside"), 2),
                                      ((3, "between"), 3)])
def test_treat_stops_at_the_first_signal_and_reports(monkeypatch, script, sig, at, runs):
    fake = FakeLaunch(sig, at)
    res = _invoke(monkeypatch, fake, ["treat", "--json", "--try", "set-to-none", "--steps", str(STEPS),
                                      str(script)])
    assert res.exit_code == 130, res.stderr[-2000:]
    rep = _json(res)
    assert rep["status"] == "interrupted"
    assert len(fake.calls) == runs, fake.calls
    assert rep["metrics"]["treat"]["stopped"] == "interrupted"


def test_treat_without_a_signal_runs_every_round(monkeypatch, script):
    fake = FakeLaunch(signal.SIGTERM, None)
    res = _invoke(monkeypatch, fake, ["treat", "--json", "--try", "set-to-none", "--steps", str(STEPS),
                                      str(script)])
    rep = _json(res)
    assert res.exit_code in (0, 1) and rep["status"] != "interrupted"
    assert len(fake.calls) == 4, fake.calls  # B T, then B T (two rounds)


# ------------------------------------------------------------------------------------- compile

def _compiled_report():
    from torchdoctor.findings import Report

    r = Report("compile")
    r.metrics["compile"] = {"compiled": True, "compiled_step_ms": 10.0, "compile_steps": [1]}
    return r


@pytest.mark.parametrize("sig", SIGNALS)
def test_compile_eager_run_interrupted_is_said_and_stops(monkeypatch, script, sig):
    from torchdoctor.commands.compile import eager_comparison

    fake = FakeLaunch(sig, (1, "inside"))
    monkeypatch.setattr("torchdoctor.runner.launch.launch", fake)
    report = _compiled_report()
    with signals.deferred():
        eager_comparison(report, str(script), [], {"steps": STEPS, "timeout": 60})
        assert signals.stopped() == signal.Signals(sig).name
    assert fake.calls == ["eager"]
    assert report.metrics["compile"]["eager_skipped"].startswith("the eager run was interrupted by")
    assert "speedup" not in report.metrics["compile"]


@pytest.mark.parametrize("sig", SIGNALS)
def test_compile_signal_after_the_compiled_run_starts_no_eager_run(monkeypatch, script, sig):
    from torchdoctor.commands.compile import eager_comparison

    fake = FakeLaunch(sig, None)
    monkeypatch.setattr("torchdoctor.runner.launch.launch", fake)
    report = _compiled_report()
    with signals.deferred():
        os.kill(os.getpid(), sig)  # while the compiled run was being judged
        eager_comparison(report, str(script), [], {"steps": STEPS, "timeout": 60})
    assert fake.calls == []
    assert report.metrics["compile"]["eager_skipped"] == f"interrupted by {signal.Signals(sig).name}"


# ------------------------------------------------------------------------------------- the scope

def test_deferred_scope_records_the_first_signal_and_raises_on_the_second():
    with signals.deferred() as scope:
        os.kill(os.getpid(), signal.SIGTERM)
        assert scope.first == "SIGTERM" and signals.stopped() == "SIGTERM"
        with pytest.raises(signals.Stopped):
            signals.check()
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGHUP)
    assert signals.stopped() is None
    signals.check()  # outside any scope: nothing recorded, nothing raised
