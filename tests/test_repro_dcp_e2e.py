"""The resume check of DCP saves, end to end (issue 29 item 3; slow lane: processes, torchrun, DCP).

- one process: a DCP save (dcp.save of Stateful objects, no process group) is described and the
  restart's reset falls right after it (the child in this process, as tests/test_repro_resume.py);
- N ranks: ``repro --resume-check --nproc-per-node 2`` on the fixtures dist/dcp_resume_*.py (the
  session's fixture runs: tests/fixture_runs.py), each rank judged; the user's DCP folders end as
  a plain torchrun run leaves them; a rank that crashes or hangs gives a clear reason and leaves no
  process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fixture_runs import run_fixture
from proc_helpers import Watched, kill_leftovers

pytestmark = pytest.mark.slow
DIST = ROOT / "tests" / "fixtures" / "scripts" / "dist"
ONE = ROOT / "tests" / "fixtures" / "scripts" / "repro" / "dcp_missing_scheduler.py"
DCP_SAVE = "torch.distributed.checkpoint.save"


def test_a_dcp_save_in_one_process_is_described_and_the_restart_resets_after_it(tmp_path):
    from test_repro_resume import _run
    from torchdoctor.reprocheck.resume import restart_variation
    from torchdoctor.reprocheck.resume_compare import compare
    from torchdoctor.reprocheck.saved import choose, missing_states

    base = _run(ONE, tmp_path, 12, {"resume_trace": True}, "resume-baseline")
    saves = base.evidence.of("save")
    assert [(s["fn"], s["target"], s["name"], s["step"]) for s in saves] == [
        (DCP_SAVE, "folder", "step4", 4), (DCP_SAVE, "folder", "step8", 8)]
    assert saves[0]["folder"] == str(tmp_path / "step4")
    # the optimizer was given as DCP's Stateful object: seen as its state, matched to the live one
    assert saves[0]["roles"]["optimizers"][0]["state_entries"] == 4 and saves[0]["matched"]["optimizers"] == ["identity"]
    # DCP's writer torch.saves its byte items itself (from under the same user line): not counted as
    # the script's saves; the run stops at step 12 before the third save
    assert list(base.evidence.last("save_sites")["sites"].values()) == [2]
    save = choose(saves, 12)
    missing = {m.state: m for m in missing_states(save)}
    assert sorted(missing) == ["rng", "scheduler"]
    run = _run(ONE, tmp_path, 10, restart_variation(save, missing["scheduler"]).options, "resume-without-scheduler")
    assert run.evidence.last("resume_reset")["reset"] == ["scheduler:0"]
    cmp = compare(base, run, 4, missing["scheduler"])
    assert cmp["verdict"] == "differs" and cmp["lr"]["first_divergent_step"] == 7


def _distcp(root: Path) -> dict[str, str]:
    """The shards of every DCP folder (``.metadata`` holds a fresh id per save: not compared)."""
    return {p.relative_to(root).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.distcp"))}


def test_a_dcp_save_without_the_optimizer_on_2_fsdp2_ranks_is_measured_and_the_folders_are_put_back(tmp_path):
    run = run_fixture("dist/dcp_resume_fsdp2_no_optim.py")
    res = run.report["metrics"]["resume"]
    assert res["ranks"] == 2 and res["status"] == "inexact" and res["checkpoint"]["fn"] == DCP_SAVE
    opt = res["restarts"][0]
    assert opt["state"] == "optimizer" and opt["ranks_differing"] == [0, 1]
    assert {r: row["verdict"] for r, row in opt["ranks"].items()} == {"0": "differs", "1": "differs"}
    f = next(f for f in run.report["findings"] if f["code"] == "ckpt-missing-optimizer")
    assert "resuming 2 ranks from this checkpoint (step 3) is not exact: without the optimizer state (AdamW)" in f["title"]
    assert f["title"].endswith("losses differ on ranks 0, 1 (the figures: rank 0's)")
    # the restarts rewrote the later DCP folders: every rank's file guard puts them back after each
    # restart (runner/fileguard.py), the resume check's own guard after the last; what counts is
    # that the folders end as a plain run leaves them:
    plain = tmp_path / "plain"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    for attempt in range(2):
        # the reference run is plain torch: once (session 13's CI, load 2 on two cores) its rank 0
        # died by SIGABRT inside gloo; a run that died by a signal is made once more, anew
        shutil.rmtree(plain, ignore_errors=True)
        plain.mkdir()
        p = subprocess.run([*torchrun, str(DIST / "dcp_resume_fsdp2_no_optim.py"), str(plain), "9"], cwd=DIST,
                           capture_output=True, text=True, timeout=300)
        if p.returncode == 0 or "Signal " not in p.stderr:
            break
    assert p.returncode == 0, p.stderr[:3000] + "\n...\n" + p.stderr[-2000:]
    assert _distcp(run.tmp) == _distcp(plain) and len(_distcp(plain)) == 6


def test_a_complete_dcp_checkpoint_resumes_exactly_on_every_rank():
    # one save of a DDP model (SGD momentum) and an FSDP2 model (AdamW, DTensor state) side by side:
    # the compared loss is their sum, so a restart that moved either would part it; each live
    # optimizer must be matched to its own saved state (their param groups differ in size), and
    # the fixture's expectation holds "2 models", "2 optimizers", "2 schedulers"
    res = run_fixture("dist/dcp_resume_ddp_fsdp2.py").report["metrics"]["resume"]
    assert res["ranks"] == 2 and res["status"] == "exact", res
    assert [(r["state"], r["verdict"], sorted(r["ranks"])) for r in res["restarts"]] == [("rng", "same", ["0", "1"])]


@pytest.mark.parametrize("script,timeout,why", [("rank_raises.py", "120", "rank 1: ValueError: bad batch at step 3"),
                                                 ("hang.py", "45", "timed out after")])
def test_a_rank_that_crashes_or_hangs_is_a_clear_reason_and_leaves_no_process(script, timeout, why):
    w = Watched("repro", "--json", "--resume-check", "--nproc-per-node", "2", "--timeout", timeout, script, cwd=DIST)
    try:
        rc, out = w.finish(timeout=400)
        rep = json.loads(out)
        assert rc == 1 and "Traceback" not in w.err.decode(errors="replace")
        res = rep["metrics"]["resume"]
        assert res["status"] == "not-judged" and res["reason"].startswith("the baseline run failed: ")
        assert why in res["reason"], res["reason"]
        assert rep["findings"], rep
        assert w.survivors(within_s=5) == []
    finally:
        kill_leftovers(w.seen)
