"""N4 (issue 13): dataloader-bound counts the wait of the loader that fed the training steps,
and says when a few steps hold the wait (median-step share beside the mean)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.rules.perf_step import concentrated_wait, dataloader_bound

SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts"


def _ev(waits, wall_extra=0.030, eval_wait=None, starts=()):
    """Steps whose training-loader wait is ``waits[i]``; ``eval_wait``: {step: s} of loader 1."""
    events = [{"kind": "data_loader", "loader": 0, "loop": "train.py:40", "dataset": "Digits",
               "num_workers": 2, "pin_memory": False, "batch_size": 32},
              {"kind": "data_loader", "loader": 1, "loop": "train.py:55", "dataset": "Digits",
               "num_workers": 0, "pin_memory": False, "batch_size": 64}]
    eval_wait = eval_wait or {}
    for n, w in enumerate(waits, start=1):
        ew = eval_wait.get(n, 0.0)
        events.append({"kind": "step", "step": n, "wall_s": w + ew + wall_extra, "data_s": w + ew,
                       "forward_s": 0.01, "backward_s": 0.01, "optimizer_s": 0.005,
                       "other_s": wall_extra - 0.025, "batches": 1 + (4 if ew else 0), "backwards": 1,
                       "source": "optimizer"})
        ds = {"kind": "data_step", "step": n, "wait_s": {"0": w}, "batches": {"0": 1}, "fed": 0}
        if ew:
            ds["wait_s"]["1"] = ew
            ds["batches"]["1"] = 4
        if n in starts:
            ds["starts"] = ["0"]
        events.append(ds)
    return Evidence.from_events(events, meta={}, result={"outcome": "exit"})


def test_an_eval_loaders_wait_is_not_the_training_loops():
    # training waits 5 ms of 35; the test loop between epochs waits 600 ms inside steps 11 and 21
    ev = _ev([0.005] * 30, eval_wait={11: 0.6, 21: 0.6})
    assert dataloader_bound(ev) == []


def test_the_share_counts_the_training_loader_only():
    ev = _ev([0.040] * 30, eval_wait={11: 0.6, 21: 0.6})
    [f] = dataloader_bound(ev)
    assert f.evidence["data_wait_ms_per_step"] == pytest.approx(40.0)
    assert f.evidence["data_wait_share"] == pytest.approx(0.040 / (0.070 + 1.2 / 29), abs=0.01)
    assert f.evidence["median_step_data_wait_share"] == pytest.approx(0.571, abs=0.01)
    assert f.evidence["loop"] == "train.py:40"
    assert set(f.evidence["data_wait_ms_per_step_by_loader"]) == {"train.py:40", "train.py:55"}


def test_a_few_load_starved_steps_are_flagged_and_do_not_make_a_warning():
    waits = [0.008] * 30
    waits[0] = 0.0  # step 1: warm-up, not judged
    waits[9], waits[19] = 0.599, 0.445  # the first batches of epochs 2 and 3: workers spin up
    ev = _ev(waits, starts=(10, 20))
    [f] = dataloader_bound(ev)
    e = f.evidence
    assert e["data_wait_share"] >= 0.3 and e["median_step_data_wait_share"] < 0.3
    assert f.severity == "info"
    assert "2 steps of 29 hold" in e["wait_concentrated"] and "steps 10, 20" in e["wait_concentrated"]
    assert "began an epoch" in e["wait_concentrated"] and "median step only" in f.title
    assert "persistent_workers=True" in f.fix


def test_a_steadily_starved_loop_stays_a_finding_of_its_declared_severity():
    [f] = dataloader_bound(_ev([0.040] * 30))
    assert f.severity == "error" and "wait_concentrated" not in f.evidence
    assert f.evidence["median_step_data_wait_share"] == pytest.approx(0.571, abs=0.01)


def test_concentration_needs_a_few_steps_holding_half_the_wait():
    assert concentrated_wait([0.01] * 20, list(range(20))) is None
    assert concentrated_wait([1.0] + [0.01] * 5, list(range(6))) is None  # too few steps to judge
    c = concentrated_wait([1.0] + [0.01] * 19, list(range(1, 21)), {1})
    assert c["steps"] == [1] and c["epoch_start"] and c["text"].startswith("1 step of 20 hold")


def test_eval_every_epoch_fixture_is_not_dataloader_bound():
    torch = pytest.importorskip("torch")  # noqa: F841
    from test_nan_fixtures import run_inprocess

    from torchdoctor.findings import Report
    from torchdoctor.evidence.steps import step_summary
    from torchdoctor.judge import judge

    script = SCRIPTS / "perf" / "eval_every_epoch.py"
    ev = run_inprocess("checkup", script, options={"steps": 0})
    s = step_summary(ev)
    # the test loop's wait is in the steps (all loaders together: what the rule counted before)
    assert s["share"]["data"] >= 0.3, s
    eval_steps = [d for d in ev.of("data_step") if len(d["wait_s"]) > 1]
    assert len(eval_steps) == 3 and all(d["fed"] == 0 for d in eval_steps)
    assert sum(1 for d in ev.of("data_step") if "0" in d.get("starts", ())) == 4  # one per epoch
    report = Report(command="checkup", target=str(script))
    judge("checkup", ev, report)
    assert "dataloader-bound" not in {f.code for f in report.findings}
    assert sum(s["share"].values()) == pytest.approx(1.0, abs=0.01)  # phases still add up
