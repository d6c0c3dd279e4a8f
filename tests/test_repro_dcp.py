"""The resume check of DCP saves and of ranked runs (issue 29 item 3).

Fast lane: the comparison rank by rank on synthetic evidence (reprocheck/resume_ranked.py), a
ranked run's failure text (trials/session.py), the user's DCP folders kept and put back
(reprocheck/guard.py), the import hook that wraps DCP once the script imports it
(runner/postimport.py), and the description of a Stateful optimizer given to dcp.save.
Slow lane (tests/slow_tests.txt): a DCP save audited and reset in one process, and end to end
on the fixtures tests/fixtures/scripts/dist/dcp_resume_*.py under torchrun.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.reprocheck.resume_ranked import check, compare_ranks, pick, ranked_finding, union_missing
from torchdoctor.reprocheck.saved import Missing
from torchdoctor.trials import TrialRun, Variation
from torchdoctor.trials.ranked import RankedTrialRun

HERE = Path(__file__).resolve().parent
WHERE = "/x/train.py:40"
ROLES = {"models": [{"path": "model", "keys": 4, "pickled": None}], "optimizers": [], "schedulers": [{"path": "s"}],
         "scalers": [], "empty_scalers": [], "rng": {}, "progress": {"step": 3}, "config": [], "fp16_signs": [],
         "bf16_signs": [], "cuda_devices": [], "part": None}
LIVE = {"models": [{"cls": "Sequential", "device": "cpu"}], "optimizers": [{"cls": "AdamW", "stateful": True}],
        "schedulers": [{"cls": "StepLR"}], "scalers": []}


def _save(step=3, n=1, where=WHERE, folder="/nonexistent/ckpt/step3", optimizer=False):
    roles = {**ROLES, "optimizers": [{"path": "optim", "state_entries": 4, "state_has_step": True, "groups": []}]
             if optimizer else []}
    return {"kind": "save", "fn": "torch.distributed.checkpoint.save", "where": where, "step": step, "n": n,
            "target": "folder", "name": os.path.basename(folder), "folder": folder, "layout": None,
            "roles": roles, "live": LIVE, "matched": {"models": ["identity"], "optimizers": ["groups" if optimizer
                                                                                             else None]}}


def _rank_run(losses, lrs, saves=(), reset=None, name="resume-baseline", result=None):
    ev = [{"kind": "step", "step": i + 1} for i in range(len(losses))]
    ev += list(saves)
    ev.append({"kind": "loss_trace", "steps": list(range(1, len(losses) + 1)), "losses": list(losses)})
    ev.append({"kind": "lr_trace", "steps": list(range(1, len(lrs) + 1)), "lrs": [[x] for x in lrs]})
    if reset is not None:
        ev.append({"kind": "resume_reset", "where": WHERE, "n": 1, "step": 3, "reset": reset, "failed": []})
    return TrialRun(Variation(name), 0, Evidence.from_events(ev, meta={}, result=result or {"outcome": "exit",
                                                                                              "exit_code": 0}), 1.0)


def _ranked(per: dict, name="resume-baseline", result=None):
    events = [{**e, "rank": r} for r, run in per.items() for e in run.evidence.events]
    merged = Evidence.from_events(events, meta={"world_size": len(per), "started": time.time()},
                                  result=result or {"outcome": "exit", "exit_code": 0})
    return RankedTrialRun(Variation(name), 0, per[min(per)].evidence, 1.0, per=per,
                          result=result or {"outcome": "exit", "exit_code": 0}, nproc=len(per), merged=merged)


BASE = {0: [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2], 1: [2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.3, 1.2]}
LRS = [0.01, 0.01, 0.005, 0.005, 0.0025, 0.0025, 0.00125, 0.00125, 0.000625]
OPT = Missing("optimizer", "ckpt-missing-optimizer", ["optimizer:0"], ["AdamW"])


def _baseline(saves_by_rank=None):
    saves_by_rank = saves_by_rank if saves_by_rank is not None else {0: [_save()], 1: [_save()]}
    return _ranked({r: _rank_run(BASE[r], LRS, saves_by_rank.get(r, ())) for r in (0, 1)})


def test_the_ranks_agree_on_a_collective_save_and_its_missing_states_are_the_union():
    save, why = pick(_baseline().ranks)
    assert why is None and save["step"] == 3 and save["where"] == WHERE
    base = _baseline({0: [_save()], 1: [_save(optimizer=True)]})
    states = union_missing([s for s in (pick({r: base.ranks[r]})[0] for r in (0, 1)) if s])
    assert [(m.state, m.keys) for m in states] == [("optimizer", ["optimizer:0"]),
                                                   ("rng", ["rng:torch", "rng:numpy", "rng:python"])]


def test_a_save_by_rank_0_only_is_not_judged_and_says_why():
    save, why = pick(_baseline({0: [_save()]}).ranks)
    assert save is None
    assert why.startswith("the checkpoint at /x/train.py:40 (step 3) was saved by rank 0 but not by rank 1")
    assert "a DCP save, or a save on every rank, is checked" in why
    save, why = pick(_baseline({0: [_save()], 1: [_save(step=6, n=2)]}).ranks)  # ranks chose other saves
    assert save is None and "but not by rank 1" in why
    assert pick(_baseline({}).ranks) == (None, None)  # no save at all: the one-process reason applies


def test_a_restart_that_parts_on_rank_1_only_is_named_by_its_rank():
    resumed = {0: BASE[0], 1: BASE[1][:4] + [1.65, 1.55, 1.45, 1.35, 1.25]}
    lrs = {0: LRS, 1: LRS[:3] + [0.01] + LRS[4:]}
    run = _ranked({r: _rank_run(resumed[r], lrs[r], reset=["optimizer:0"], name="resume-without-optimizer")
                   for r in (0, 1)}, name="resume-without-optimizer")
    cmp = compare_ranks(_baseline(), run, 3, OPT)
    assert cmp["verdict"] == "differs" and cmp["rank"] == 1 and cmp["ranks_differing"] == [1]
    assert cmp["first_divergent_step"] == 5 and cmp["lr"]["first_divergent_step"] == 4
    assert cmp["ranks"]["0"]["verdict"] == "same" and cmp["ranks"]["1"]["first_divergent_step"] == 5
    f = ranked_finding(_save(), OPT, cmp, 9, 2)
    assert (f.code, f.severity) == ("ckpt-missing-optimizer", "warning")
    assert f.title.startswith("torch.distributed.checkpoint.save at ")
    assert "resuming 2 ranks from this checkpoint (step 3) is not exact: without the optimizer state (AdamW)" in f.title
    assert f.title.endswith("; losses differ on rank 1")
    assert "(1.65 resumed vs 1.6 uninterrupted)" in f.title  # rank 1's numbers
    assert f.evidence["ranks_differing"] == [1] and f.evidence["by_rank"]["1"]["verdict"] == "differs"
    assert "on 2 ranks under torchrun" in f.evidence["measured"]


def test_a_restart_that_parts_on_both_ranks_names_both_and_whose_figures_the_title_quotes():
    resumed = {r: BASE[r][:4] + [x + 0.05 for x in BASE[r][4:]] for r in (0, 1)}
    run = _ranked({r: _rank_run(resumed[r], LRS, reset=["optimizer:0"]) for r in (0, 1)})
    cmp = compare_ranks(_baseline(), run, 3, OPT)
    assert cmp["ranks_differing"] == [0, 1] and cmp["rank"] == 0
    assert ranked_finding(_save(), OPT, cmp, 9, 2).title.endswith("; losses differ on ranks 0, 1 (the figures: rank 0's)")


def test_a_restart_that_changes_nothing_and_one_that_crashed_on_a_rank():
    same = _ranked({r: _rank_run(BASE[r], LRS, reset=["rng:torch"]) for r in (0, 1)})
    assert compare_ranks(_baseline(), same, 3, OPT)["verdict"] == "same"
    crashed = {0: _rank_run(BASE[0][:4], LRS[:4], result={"outcome": "signal", "signal": "SIGTERM"}),
               1: _rank_run(BASE[1][:4], LRS[:4], result={"outcome": "crash", "exit_code": 1, "exception": {
                   "type": "ValueError", "message": "bad batch", "user_frame": {"file": "t.py", "line": 9}}})}
    run = _ranked(crashed, result={"outcome": "crash", "failed_rank": 1, "exit_code": 1})
    assert run.failure() == "rank 1: ValueError: bad batch at t.py:9"
    cmp = compare_ranks(_baseline(), run, 3, OPT)
    assert cmp["verdict"] == "failed" and cmp["reason"] == "rank 1: ValueError: bad batch at t.py:9"


def test_a_ranked_run_whose_rank_never_started_or_made_no_step_is_a_failure():
    one = _ranked({0: _rank_run(BASE[0], LRS)})
    one.nproc = 2  # launched on 2 ranks: rank 1 left no run dir
    assert one.failure().startswith("rank 1 did not start")
    quiet = _ranked({0: _rank_run(BASE[0], LRS), 1: _rank_run([], [])})
    assert quiet.failure() == "rank 1: no training step was measured"
    assert _baseline().failure() is None


class _Trials:
    """The trials layer as check() uses it: restarts answered from a table."""

    def __init__(self, restarts):
        self.restarts, self.asked = restarts, []

    def expired(self):
        return False

    def run(self, variation, round=0, *, probe=None, steps=None):
        self.asked.append((variation.name, variation.options["resume_reset"], steps))
        return self.restarts[variation.name]


def test_check_restarts_every_missing_state_once_for_all_ranks_and_judges_rank_by_rank():
    parted = {r: BASE[r][:4] + [x + 0.05 for x in BASE[r][4:]] for r in (0, 1)}
    trials = _Trials({
        "resume-without-optimizer": _ranked({r: _rank_run(parted[r], LRS, reset=["optimizer:0"]) for r in (0, 1)}),
        "resume-without-rng": _ranked({r: _rank_run(BASE[r], LRS, reset=["rng:torch"]) for r in (0, 1)})})
    findings, section = check(trials, _baseline(), {"baseline": "resume-baseline"}, 6)
    assert [a[0] for a in trials.asked] == ["resume-without-optimizer", "resume-without-rng"]
    assert trials.asked[0][1] == {"site": WHERE, "n": 1, "reset": ["optimizer:0"]} and trials.asked[0][2] == 9
    assert section["status"] == "inexact" and section["ranks"] == 2
    assert section["checkpoint"] == {"saved_at": WHERE, "save": 1, "step": 3, "file": "step3",
                                     "fn": "torch.distributed.checkpoint.save"}
    assert [r["verdict"] for r in section["restarts"]] == ["differs", "same"]
    assert [f.code for f in findings] == ["ckpt-missing-optimizer"]
    _f, section = check(_Trials({}), _baseline({0: [_save()]}), {}, 6)
    assert section["status"] == "not-judged" and "saved by rank 0 but not by rank 1" in section["reason"]
    _f, section = check(_Trials({}), _baseline({}), {}, 6)
    assert section == {"ranks": 2, "status": "no-checkpoint",
                       "reason": "the script saved no checkpoint to a file or DCP folder"}


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_own_files_keep_a_dcp_folder_and_its_siblings_and_put_them_back(tmp_path):
    from torchdoctor.reprocheck.guard import OwnFiles

    started = time.time()
    ck = tmp_path / "ckpt"
    for step in (3, 6, 9):
        d = ck / f"step{step}"
        d.mkdir(parents=True)
        (d / ".metadata").write_bytes(b"meta %d" % step)
        for r in (0, 1):
            (d / f"__{r}_0.distcp").write_bytes(b"shard %d of rank %d" % (step, r))
    before = _tree(ck)
    # only the first two saves are described (MAX_PER_SITE), on each rank
    per = {r: _rank_run(BASE[r], LRS, [_save(folder=str(ck / "step3")), _save(6, 2, folder=str(ck / "step6"))])
           for r in (0, 1)}
    base = _ranked(per)
    base.evidence.meta["started"] = started
    own = OwnFiles(base)
    assert own.folders == [(str(ck), 2)]
    assert own.keep() and len(own.kept) == 9
    time.sleep(0.01)
    (ck / "step9" / "__1_0.distcp").write_bytes(b"a restart's altered shard")  # not described, still kept
    (ck / "step6" / ".metadata").write_bytes(b"x")
    (ck / "step12").mkdir()  # written by nobody's plain run: left where it is
    own.restore()
    assert _tree(ck) == before and (ck / "step12").is_dir()
    assert own.summary() == {"kept": 9, "restored": 2}


def test_when_imported_runs_after_the_module_code_once_and_is_removed(tmp_path, monkeypatch):
    from torchdoctor.runner.postimport import when_imported

    pkg = tmp_path / "td_dcp_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from td_dcp_probe_pkg.saver import save\n")
    (pkg / "saver.py").write_text("def save(sd, *, checkpoint_id=None):\n    return 'orig'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    h = when_imported("td_dcp_probe_pkg", lambda m: seen.append(m.save.__name__))
    assert h in sys.meta_path and seen == []
    try:
        import td_dcp_probe_pkg

        assert seen == ["save"] and td_dcp_probe_pkg.save({}) == "orig"
        assert h not in sys.meta_path
        assert td_dcp_probe_pkg.__loader__.__class__.__name__ != "_Loader"  # the module keeps its own loader
        again = when_imported("td_dcp_probe_pkg", lambda m: seen.append("now"))  # already imported: at once
        assert seen == ["save", "now"] and again not in sys.meta_path
        errors = []
        h2 = when_imported("td_dcp_probe_other", lambda m: 1 / 0, on_error=lambda: errors.append(1))
        (tmp_path / "td_dcp_probe_other.py").write_text("x = 1\n")
        import td_dcp_probe_other  # noqa: F401 - the import succeeds though the callback raised

        assert errors == [1] and h2 not in sys.meta_path
    finally:
        for name in ("td_dcp_probe_pkg", "td_dcp_probe_pkg.saver", "td_dcp_probe_other"):
            sys.modules.pop(name, None)
        h.remove()


def test_a_stateful_optimizer_given_to_dcp_is_described_as_its_state():
    torch = pytest.importorskip("torch")
    from torchdoctor.checkpoint.roles import recognise
    from torchdoctor.instruments.save_audit.save_audit import _dcp_view
    from torchdoctor.instruments.save_audit.save_audit_mirror import mirror

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()

    class App:  # the DCP tutorial's AppState: Stateful, holding the model and the optimizer
        def __init__(self):
            self.model, self.optimizer = model, opt

        def state_dict(self):
            raise AssertionError("the description never calls the user's state_dict()")

        def load_state_dict(self, sd):
            pass

    for obj in ({"model": model, "optim": opt}, {"app": App()}):
        view = _dcp_view(obj)
        r = recognise(mirror(view).root)
        assert len(r.optimizers) == 1 and len(r.optimizers[0].state) == 2, obj
        assert r.model is not None
    inner = _dcp_view({"optim": opt})["optim"]
    assert inner["state"][0]["exp_avg"] is opt.state[model.weight]["exp_avg"]  # read, not copied
    assert inner["param_groups"][0]["params"] == [0, 1] and opt.param_groups[0]["params"][0] is model.weight


def test_the_folder_of_a_dcp_save_is_its_checkpoint_id_or_its_writers_path(tmp_path):
    from types import SimpleNamespace

    from torchdoctor.instruments.save_audit.save_audit import _dcp_folder

    writer = SimpleNamespace(path=tmp_path / "w")
    assert _dcp_folder(({},), {"checkpoint_id": "ck/step3", "storage_writer": writer}) == "ck/step3"
    assert _dcp_folder(({},), {"storage_writer": writer}) == tmp_path / "w"
    assert _dcp_folder(({}, writer), {}) == tmp_path / "w"  # save_state_dict(state_dict, storage_writer)
    assert _dcp_folder(({},), {"storage_writer": SimpleNamespace(path=None)}) is None  # a writer of another kind
    assert _dcp_folder(({},), {}) is None
