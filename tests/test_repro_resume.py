"""The resume check (issue 17 item 4 B): restart at the script's own checkpoint, compare, name the state.

Fast tests run the child side in this process (tests/test_nan_fixtures.run_inprocess: the
harness without a subprocess) on save_missing_scheduler.py — the uninterrupted run and the
restarts with one state reset — and judge them with the same comparison and finding code the
command uses. The end-to-end test reads the session's `repro --resume-check` run of
repro/dcp_missing_scheduler.py (its header: the same loop saved with dcp.save): marked slow, the
fast tests cover the same behaviour.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.reprocheck.resume import restart_variation
from torchdoctor.reprocheck.resume_compare import compare, finding_for
from torchdoctor.reprocheck.saved import MIN_AFTER, Missing, choose, missing_states, not_simulated
from torchdoctor.trials import TrialRun, Variation

HERE = Path(__file__).resolve().parent
SICK = HERE / "fixtures" / "scripts" / "repro" / "save_missing_scheduler.py"
DROPOUT = HERE / "fixtures" / "scripts" / "repro" / "resume_dropout.py"


def _run(script: Path, tmp: Path, steps: int, options: dict, name: str, *extra: str,
         script_steps: int | None = None) -> TrialRun:
    """One trial run in this process, armed as Trials.run arms it (the probe's needs, the
    trials' loss trace, the resume check's save audit)."""
    import torchdoctor.pipeline.registry as reg
    from test_nan_fixtures import run_inprocess
    from torchdoctor.reprocheck.resume import RESUME_NEEDS
    from torchdoctor.trials import TRIAL_NEEDS

    armed = reg.armed_needs
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reg, "armed_needs", lambda probe: armed(probe) | TRIAL_NEEDS | RESUME_NEEDS)
        ev = run_inprocess("repro", script, (str(tmp), str(script_steps or steps), *extra),
                           {"steps": steps, "trial": name, **options})
    return TrialRun(Variation(name), 0, ev, 0.0)


@pytest.fixture(scope="module")
def sick_runs(tmp_path_factory):
    """The sick fixture uninterrupted (12 steps), then restarted at its first save (step 4)
    without the scheduler's state, and without the RNG states (10 steps each)."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("resume")
    base = _run(SICK, tmp, 12, {"resume_trace": True}, "resume-baseline")
    save = choose(base.evidence.of("save"), 12)
    out = {"base": base, "save": save, "missing": {m.state: m for m in missing_states(save)}}
    for state in ("scheduler", "rng"):
        m = out["missing"][state]
        out[state] = _run(SICK, tmp, 10, restart_variation(save, m).options, f"resume-without-{state}")
    return out


def test_the_checkpoint_is_the_first_snapshot_and_its_missing_states_are_named(sick_runs):
    save, missing = sick_runs["save"], sick_runs["missing"]
    assert save["step"] == 4 and save["n"] == 1 and save["where"].endswith("save_missing_scheduler.py:29")
    assert sorted(missing) == ["rng", "scheduler"]
    assert missing["scheduler"].keys == ["scheduler:0"] and missing["scheduler"].names == ["StepLR"]
    assert missing["rng"].keys == ["rng:torch", "rng:numpy", "rng:python"]  # no CUDA model: no CUDA generator
    assert not_simulated(save) == []  # the save holds "epoch"


def test_without_the_scheduler_state_the_lr_and_then_the_losses_part_from_the_uninterrupted_run(sick_runs):
    base, run, save = sick_runs["base"], sick_runs["scheduler"], sick_runs["save"]
    reset = run.evidence.last("resume_reset")
    assert reset["reset"] == ["scheduler:0"] and reset["step"] == 4 and not reset["failed"]
    cmp = compare(base, run, 4, sick_runs["missing"]["scheduler"])
    # StepLR(step_size=3, gamma=0.5) from 0.1: steps 7-9 use 0.025; restarted at step 4 with a fresh
    # scheduler (last_epoch 0) the LR stays 0.05 until its own third step
    assert cmp["verdict"] == "differs"
    assert cmp["lr"] == {"first_divergent_step": 7, "optimizer": 0, "uninterrupted": [0.025], "resumed": [0.05]}
    assert cmp["first_divergent_step"] == 8  # the loss of step 8 is the first computed after the LR changed
    assert cmp["losses"]["uninterrupted"][:3] == cmp["losses"]["resumed"][:3]
    f = finding_for(save, sick_runs["missing"]["scheduler"], cmp, 12)
    assert (f.code, f.severity) == ("ckpt-missing-scheduler", "warning")
    assert "without the scheduler state (StepLR) the LR at step 7 is 0.05 instead of 0.025; " \
           "losses differ from step 8" in f.title
    assert f.evidence["saved_at"].endswith("save_missing_scheduler.py:29")


def test_without_the_rng_states_a_script_that_draws_nothing_after_start_up_resumes_the_same(sick_runs):
    cmp = compare(sick_runs["base"], sick_runs["rng"], 4, sick_runs["missing"]["rng"])
    assert cmp["verdict"] == "same" and cmp["loss_drift"] == 0.0 and cmp["steps_compared"] == 6
    assert cmp["applied"] == ["rng:torch", "rng:numpy", "rng:python"]


def test_the_restart_leaves_the_runs_identical_up_to_the_save(sick_runs):
    b, r = sick_runs["base"].losses(), sick_runs["scheduler"].losses()
    assert b[:4] == r[:4] and len(r) == 10


# ---------------------------------------------------------------- pure parts, on numbers
class _Ev:
    def __init__(self, losses, lrs=None, reset=None, result=None):
        from torchdoctor.evidence import Evidence

        events = [{"kind": "step", "step": i + 1} for i in range(len(losses))]
        events.append({"kind": "loss_trace", "steps": list(range(1, len(losses) + 1)), "losses": losses})
        if lrs is not None:
            events.append({"kind": "lr_trace", "steps": list(range(1, len(lrs) + 1)),
                           "lrs": [x if isinstance(x, list) else [x] for x in lrs]})
        if reset is not None:
            events.append({"kind": "resume_reset", **reset})
        self.ev = Evidence.from_events(events, result=result or {"outcome": "exit", "exit_code": 0})

    def run(self, name="r"):
        return TrialRun(Variation(name), 0, self.ev, 0.0)


MISS = Missing("optimizer", "ckpt-missing-optimizer", ["optimizer:0"], ["Adam"])
RESET = {"reset": ["optimizer:0"], "failed": [], "step": 2}


def test_runs_that_differ_before_the_save_are_not_judged():
    base = _Ev([1.0, 0.9, 0.8, 0.7]).run()
    cmp = compare(base, _Ev([1.0, 0.91, 0.8, 0.7], reset=RESET).run(), 2, MISS)
    assert cmp["verdict"] == "not-reproducible" and "at step 2" in cmp["reason"]


def test_a_restart_whose_save_was_not_reached_is_not_applied():
    base = _Ev([1.0, 0.9, 0.8, 0.7]).run()
    assert compare(base, _Ev([1.0, 0.9, 0.8, 0.7]).run(), 2, MISS)["verdict"] == "not-applied"
    failed = dict(RESET, reset=[], failed=["optimizer:0"])
    assert compare(base, _Ev([1.0, 0.9, 0.8, 0.7], reset=failed).run(), 2, MISS)["verdict"] == "not-applied"


def test_a_crashed_restart_is_reported_as_failed():
    crash = {"outcome": "crash", "exit_code": 1, "exception": {"type": "KeyError", "message": "x"}}
    cmp = compare(_Ev([1.0, 0.9]).run(), _Ev([1.0], result=crash).run(), 1, MISS)
    assert cmp["verdict"] == "failed" and cmp["reason"].startswith("KeyError")


def test_the_first_divergent_step_is_the_first_loss_after_the_save_that_differs():
    base = _Ev([1.0, 0.9, 0.8, 0.7, 0.6], lrs=[0.1] * 5).run()
    run = _Ev([1.0, 0.9, 0.8, 0.75, 0.65], lrs=[0.1, 0.1, 0.1, 0.1, 0.1], reset=RESET).run()
    cmp = compare(base, run, 2, MISS)
    assert cmp["verdict"] == "differs" and cmp["first_divergent_step"] == 4 and "lr" not in cmp
    save = {"fn": "torch.save", "where": "/w/t.py:9", "step": 2, "n": 1, "target": "file",
            "roles": {"models": [{"path": "model", "keys": 2}], "progress": {"epoch": 1}},
            "live": {"optimizers": [{"cls": "Adam", "stateful": True, "groups": [2]}]},
            "matched": {"optimizers": [None]}}
    f = finding_for(save, MISS, cmp, 5)
    assert (f.code, f.severity) == ("ckpt-missing-optimizer", "warning")
    assert f.title.endswith("without the optimizer state (Adam) losses differ from step 4 (0.75 resumed vs 0.7 "
                            "uninterrupted)")



def test_the_title_names_the_optimizer_whose_lr_parted_with_its_two_values():
    """Two live optimizers, the second's LR parts: the title gives that one's LRs, not the first's."""
    base = _Ev([1.0, 0.9, 0.8, 0.7, 0.6], lrs=[[0.025, 0.1]] * 5).run()
    run = _Ev([1.0, 0.9, 0.8, 0.75, 0.65], lrs=[[0.025, 0.1]] * 3 + [[0.025, 0.05]] * 2, reset=RESET).run()
    miss = Missing("scheduler", "ckpt-missing-scheduler", ["scheduler:1"], ["StepLR"])
    cmp = compare(base, run, 2, miss)
    assert cmp["lr"] == {"first_divergent_step": 4, "optimizer": 1, "uninterrupted": [0.025, 0.1],
                         "resumed": [0.025, 0.05]}
    save = {"fn": "torch.save", "where": "/w/t.py:9", "step": 2, "n": 1, "target": "file",
            "roles": {"models": [{"path": "model", "keys": 2}], "progress": {"epoch": 1}},
            "live": {"optimizers": [{"cls": "SGD", "stateful": True, "groups": [2]},
                                    {"cls": "AdamW", "stateful": True, "groups": [2]}]},
            "matched": {"optimizers": ["identity", "identity"]}}
    f = finding_for(save, miss, cmp, 5)
    assert "the LR of optimizer 1 (AdamW) at step 4 is 0.05 instead of 0.1;" in f.title
    assert f.evidence["lr_first_divergent_step"]["optimizer"] == 1
    # one live optimizer: the title says "the LR", as before
    one = compare(_Ev([1.0, 0.9, 0.8, 0.7], lrs=[0.1] * 4).run(),
                  _Ev([1.0, 0.9, 0.8, 0.75], lrs=[0.1, 0.1, 0.1, 0.05], reset=RESET).run(), 2, MISS)
    single = dict(save, live={"optimizers": save["live"]["optimizers"][1:]})
    assert "the LR at step 4 is 0.05 instead of 0.1;" in finding_for(single, MISS, one, 4).title

def test_choose_prefers_a_training_snapshot_with_steps_after_it():
    def s(step, roles, target="file"):
        return {"step": step, "target": target, "roles": roles, "where": f"w:{step}", "n": 1}

    weights = {"models": [{"path": "", "keys": 2}]}
    snap = {"models": [{"path": "model", "keys": 2}], "progress": {"epoch": 1}}
    saves = [s(1, snap, "memory"), s(2, weights), s(3, snap), s(9, snap)]
    assert choose(saves, 10)["step"] == 3
    assert choose([s(2, weights)], 10)["step"] == 2  # no snapshot: the export is resumed from
    assert choose([s(9, snap)], 10) is None and 10 - 9 < MIN_AFTER


def test_missing_states_follow_the_live_objects():
    save = {"roles": {"optimizers": [{"path": "opt"}], "rng": {"torch": "rng"}},
            "live": {"models": [{"device": "cuda:0"}],
                     "optimizers": [{"cls": "Adam", "stateful": True}, {"cls": "SGD", "stateful": False}],
                     "schedulers": [{"cls": "LambdaLR"}], "scalers": [{"cls": "GradScaler", "enabled": True}]},
            "matched": {"optimizers": ["identity", None]}}
    got = {m.state: m.keys for m in missing_states(save)}
    assert got == {"scheduler": ["scheduler:0"], "scaler": ["scaler:0"],
                   "rng": ["rng:cuda", "rng:numpy", "rng:python"]}  # SGD holds nothing and is unscheduled
    assert not_simulated(save)  # no progress counter: the loop's variables cannot be restarted in-process


# ---------------------------------------------------------------- end to end, on the trials layer
@pytest.mark.slow
def test_repro_resume_check_end_to_end_replaces_the_save_audit_with_the_measured_finding():
    """`torchdoctor repro --resume-check` (the command's wiring, the trials layer, the rules), on
    the session's header run of repro/dcp_missing_scheduler.py (the same loop and StepLR as
    save_missing_scheduler.py, saved with dcp.save; the torch.save judgment is the in-process tests'
    above): the two runs are identical, and the save audit's ckpt-missing-scheduler at the save
    line is replaced by the measured one (the LR and the losses part after the restart)."""
    from fixture_runs import run_fixture

    pytest.importorskip("torch")
    r = run_fixture("repro/dcp_missing_scheduler.py", "repro --resume-check --steps 12 -- {tmp}")
    rep = r.report
    assert r.returncode == 0, r.stderr[-2000:]
    assert rep["metrics"]["repro"]["identical"] is True
    sec = rep["metrics"]["resume"]
    assert sec["status"] == "inexact" and sec["checkpoint"]["step"] == 4
    assert [(x["state"], x["verdict"]) for x in sec["restarts"]] == [("scheduler", "differs"), ("rng", "same")]
    sched = [f for f in rep["findings"] if f["code"] == "ckpt-missing-scheduler"]
    assert len(sched) == 1 and sched[0]["severity"] == "warning"
    assert "is not exact" in sched[0]["title"] and "dcp_missing_scheduler.py:33" in sched[0]["title"]
    assert {f["code"] for f in rep["findings"]} == {"ckpt-missing-scheduler", "ckpt-missing-rng"}


def test_without_the_rng_state_dropout_masks_differ_from_the_first_step_after_the_save(tmp_path):
    pytest.importorskip("torch")
    base = _run(DROPOUT, tmp_path, 9, {"resume_trace": True}, "resume-baseline")
    save = choose(base.evidence.of("save"), 9)
    (miss,) = missing_states(save)  # model, optimizer, step saved: only the generators are missing
    assert save["step"] == 3 and miss.state == "rng"
    run = _run(DROPOUT, tmp_path, 9, restart_variation(save, miss).options, "resume-without-rng")
    cmp = compare(base, run, 3, miss)
    assert cmp["verdict"] == "differs" and cmp["first_divergent_step"] == 4 and "lr" not in cmp
    f = finding_for(save, miss, cmp, 9)
    # an exact resume was asked for: the family's --expect resume severity (warning), not the audit's info
    assert (f.code, f.severity) == ("ckpt-missing-rng", "warning")
    assert "without the RNG state (torch generator, numpy generator, python generator) losses differ from " \
           "step 4" in f.title


def test_a_scaled_loss_is_compared_unscaled():
    """With a GradScaler the traced loss is loss * scale: a restart that only resets the scale
    (no step skipped) trains the same and must read the same."""
    ev = _Ev([2.0, 1.8, 1.6, 1.4], lrs=[0.1] * 4)
    ev.ev.events[-1]["scales"] = [[2.0]] * 4
    base = TrialRun(Variation("b"), 0, type(ev.ev).from_events(ev.ev.events, result=ev.ev.result), 0.0)
    r = _Ev([2.0, 1.8, 0.8 * 4, 0.7 * 4], lrs=[0.1] * 4, reset=RESET)
    r.ev.events[-2]["scales"] = [[2.0], [2.0], [4.0], [4.0]]  # the lr_trace event (before resume_reset)
    run = TrialRun(Variation("r"), 0, type(r.ev).from_events(r.ev.events, result=r.ev.result), 0.0)
    cmp = compare(base, run, 2, Missing("scaler", "ckpt-missing-scaler", ["scaler:0"], ["GradScaler"]))
    assert cmp["verdict"] == "same", cmp


AMP = HERE / "fixtures" / "scripts" / "repro" / "resume_amp_scaler.py"


def test_without_the_grad_scaler_state_the_restart_skips_batches_again(tmp_path):
    """float16 on CPU with an enabled GradScaler: the save audit rates the missing scaler state info
    (as checkpoint-audit does), the resume check measures it: the scale restarts at 2**20, the first
    iterations after the restart overflow and are skipped with their batches."""
    pytest.importorskip("torch")
    from torchdoctor.judge import all_rules

    base = _run(AMP, tmp_path, 16, {"resume_trace": True}, "resume-baseline")
    audit = all_rules()["ckpt-saves"].fn(base.evidence)
    assert sorted((f.code, f.severity) for f in audit) == [("ckpt-missing-rng", "info"),
                                                           ("ckpt-missing-scaler", "info")]
    assert any("GradScaler" in s for f in audit for s in f.evidence.get("float16_signs", []))
    steps = base.evidence.result["steps"]
    save = choose(base.evidence.of("save"), steps)
    miss = {m.state: m for m in missing_states(save)}
    # iteration 6 is step 2: four iterations overflowed and were skipped
    assert sorted(miss) == ["rng", "scaler"] and save["step"] == 2
    run = _run(AMP, tmp_path, 16, restart_variation(save, miss["scaler"]).options, "resume-without-scaler")
    cmp = compare(base, run, 2, miss["scaler"])
    assert cmp["verdict"] == "differs" and cmp["first_divergent_step"] == 3
    f = finding_for(save, miss["scaler"], cmp, steps)
    assert (f.code, f.severity) == ("ckpt-missing-scaler", "warning")  # an exact resume was asked for
    assert "without the scaler state (GradScaler) losses differ from step 3" in f.title


@pytest.mark.gpu
def test_on_cuda_the_grad_scaler_and_the_cuda_generator_are_checked(tmp_path):
    """The same float16 fixture on CUDA (run on the GPU box): the CUDA generator counts as missing
    (a model trains there), and restarting with a fresh GradScaler changes the losses."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    base = _run(AMP, tmp_path, 16, {"resume_trace": True}, "resume-baseline", "cuda")
    steps = base.evidence.result["steps"]
    save = choose(base.evidence.of("save"), steps)
    miss = {m.state: m for m in missing_states(save)}
    assert sorted(miss) == ["rng", "scaler"] and "rng:cuda" in miss["rng"].keys
    run = _run(AMP, tmp_path, 16, restart_variation(save, miss["scaler"]).options, "resume-without-scaler", "cuda")
    cmp = compare(base, run, int(save["step"]), miss["scaler"])
    assert cmp["verdict"] == "differs", cmp
    f = finding_for(save, miss["scaler"], cmp, steps)
    assert (f.code, f.severity) == ("ckpt-missing-scaler", "warning")


def test_a_callers_run_is_the_baseline_only_when_it_carries_the_resume_trace():
    from torchdoctor.reprocheck.resume import resume_check

    class _Trials:
        def __init__(self):
            self.ran = []

        def run(self, variation, steps=None):
            self.ran.append(variation.name)
            return _Ev([1.0, 0.9], result={"outcome": "crash", "exception": {"type": "E"}}).run(variation.name)

        def expired(self):
            return False

    plain = _Ev([1.0, 0.9, 0.8]).run("run-a")  # no save events, no LR trace
    t = _Trials()
    _f, section = resume_check(t, baseline=plain)
    assert t.ran == ["resume-baseline"] and section["status"] == "not-judged"
    traced = _Ev([1.0, 0.9, 0.8], lrs=[0.1] * 3)
    traced.ev = type(traced.ev).from_events(traced.ev.events + [{"kind": "save", "step": 1, "target": "memory"}],
                                            result=traced.ev.result)
    t = _Trials()
    _f, section = resume_check(t, baseline=traced.run("run-a"))
    assert t.ran == [] and section["status"] == "no-checkpoint"


def test_saves_into_memory_buffers_are_not_called_no_save():
    """Issue 27 re-run: LightningCLI's checkpoint (trainer.save_checkpoint: torch.save into io.BytesIO,
    the bytes then written by fsspec) was reported as "the script saved no checkpoint to a file"."""
    from torchdoctor.evidence import Evidence
    from torchdoctor.reprocheck.resume import resume_check

    class _Trials:
        def __init__(self, events):
            self.events = events

        def run(self, variation, steps=None):
            return TrialRun(variation, 0, Evidence.from_events(self.events, result={"outcome": "exit"}), 0.0)

    steps = [{"kind": "step", "step": i} for i in range(1, 5)]
    counted = steps + [{"kind": "save_sites", "sites": {"/w/train.py:132": 1}, "layouts": [], "renamed": []}]
    _f, section = resume_check(_Trials(counted))
    assert section["status"] == "no-checkpoint"
    assert section["reason"].startswith("the script's 1 torch.save call(s) wrote into in-memory buffers")
    assert "checkpoint-audit" in section["reason"]
    _f, section = resume_check(_Trials(steps))
    assert section["reason"] == "the script saved no checkpoint to a file or DCP folder"


def test_the_users_checkpoint_after_the_resume_check_is_what_a_plain_run_writes(tmp_path, monkeypatch):
    """Issue 27 item 4: the restarts (generators reset after the save at step 3, then on to step
    9) write the script's ckpt.pt again at steps 6 and 9 from a state torchdoctor altered; the
    user's ckpt.pt must end as a plain run of the script writes it."""
    import runpy
    import sys

    torch = pytest.importorskip("torch")
    from torchdoctor.reprocheck.resume import resume_check

    plain, ours = tmp_path / "plain", tmp_path / "ours"
    plain.mkdir()
    ours.mkdir()
    # the plain run: the script itself in this process (where the runs below run too), no torchdoctor
    monkeypatch.setattr(sys, "argv", [str(DROPOUT), str(plain), "9"])
    runpy.run_path(str(DROPOUT), run_name="__main__")

    class _Trials:
        ran: list = []

        def run(self, variation, steps=None):
            self.ran.append(variation.name)
            return _run(DROPOUT, ours, steps or 10, variation.options, variation.name, script_steps=9)

        def expired(self):
            return False

    t = _Trials()
    # the script's 9 steps within the bound of 10: it ends on its own, after its save at step 9
    base = _run(DROPOUT, ours, 10, {"resume_trace": True}, "resume-baseline", script_steps=9)
    _f, section = resume_check(t, baseline=base)
    assert t.ran == ["resume-without-rng"] and section["restarts"][0]["verdict"] == "differs"
    a = torch.load(plain / "ckpt.pt", weights_only=True)
    b = torch.load(ours / "ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 9  # without the guard: the restart's step-6 file
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert (plain / "ckpt.pt").read_bytes() == (ours / "ckpt.pt").read_bytes()
    assert section["own_files"] == {"kept": 1, "restored": 1}  # the restart had rewritten it
