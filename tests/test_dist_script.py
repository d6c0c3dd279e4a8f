"""Script probes under torchrun end to end: 2 gloo ranks on CPU (CI), NCCL on 2+ GPUs (multigpu).

Each test is one real torchrun launch (≈ 4-6 s on the CPU box) of a fixture in
tests/fixtures/scripts/dist/, with --out so the rank dirs (pid files) stay for the checks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, run_cli
from fixture_runs import run_fixture

DIST = ROOT / "tests" / "fixtures" / "scripts" / "dist"
CPU = {"CUDA_VISIBLE_DEVICES": ""}


def dist_run(tmp_path: Path, script: str, *args: str, timeout: float = 60, env=None, cmd="dist",
             nproc: int = 2) -> tuple[object, dict]:
    p = run_cli(cmd, "--json", "--nproc-per-node", nproc, "--timeout", timeout, "--out", tmp_path,
                script, *args, cwd=DIST, timeout=timeout + 60, env=env)
    assert p.stdout.strip(), p.stderr[-3000:]
    return p, json.loads(p.stdout)


def cached(script: str, command: str) -> tuple[object, dict, Path]:
    """The session's run of dist/SCRIPT under its header command (tests/test_fixtures.py shares
    it); its --out folder (the rank dirs) is the run's tmp."""
    r = run_fixture(f"dist/{script}", command)
    return r, r.report, r.tmp


def codes(report: dict, severities=("error", "warning")) -> list[str]:
    return sorted(f["code"] for f in report["findings"] if f["severity"] in severities)


def only(report: dict, code: str) -> dict:
    [f] = [f for f in report["findings"] if f["code"] == code]
    return f


def assert_no_rank_left(out: Path) -> None:
    """Every rank's pid (written by the rank itself) is gone, or reused by something else."""
    pids = [int(p.read_text()) for p in (out / "run").glob("rank*/pid")]
    assert pids, "no rank wrote its pid"
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            alive = proc.status() != psutil.STATUS_ZOMBIE and str(out) in " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, f"rank process {pid} survived"


# --------------------------------------------------------------------------- CPU / gloo (CI)
@pytest.mark.slow
def test_healthy_ddp_with_distributed_sampler_raises_no_warning():
    p, r, tmp_path = cached("healthy_ddp.py", "dist --nproc-per-node 2 --timeout 60 --out {tmp}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert codes(r) == [], r["findings"]
    assert r["command"] == "dist" and r["context"]["ranks"] == 2
    ranks = r["metrics"]["ranks"]
    assert [row["rank"] for row in ranks["per_rank"]] == [0, 1]
    assert all(row["steps"] == 24 and row["median_step_ms"] > 0 for row in ranks["per_rank"])
    assert r["metrics"]["run"]["outcome"] == "exit"
    assert [x["outcome"] for x in r["metrics"]["run"]["ranks"]] == ["exit", "exit"]
    for rank in (0, 1):
        d = tmp_path / "run" / f"rank{rank}"
        assert (d / "events.jsonl").is_file() and (d / "result.json").is_file()
    assert_no_rank_left(tmp_path)


SAMPLER_BUGS = "dist --nproc-per-node 2 --timeout 90 --out {tmp} -- {tmp}/pids"  # dist/sampler_bugs.py's header


def at_loop(report: dict, code: str, loop: str) -> dict:
    """The one finding CODE names at LOOP (sampler_bugs.py plants each bug at its own loop)."""
    [f] = [f for f in report["findings"] if f["code"] == code and f["evidence"].get("loop") == loop]
    return f


@pytest.mark.slow
def test_missing_distributed_sampler():
    _, r, _ = cached("sampler_bugs.py", SAMPLER_BUGS)
    # the script's other bug (sampler_bugs.py:56) is the only other warning or error
    assert codes(r) == ["missing-distributed-sampler", "sampler-epoch-not-set"], r["findings"]
    f = only(r, "missing-distributed-sampler")
    assert "sampler_bugs.py:43" in f["title"] and f["evidence"]["sampler"] == "RandomSampler"


@pytest.mark.slow
def test_sampler_epoch_not_set():
    _, r, _ = cached("sampler_bugs.py", SAMPLER_BUGS)
    assert at_loop(r, "sampler-epoch-not-set", "sampler_bugs.py:56")["evidence"]["sampler_epochs"] == [0, 0, 0]


@pytest.mark.slow
def test_a_batch_peeked_before_set_epoch_is_not_an_epoch():
    """The DDP tutorial's Trainer peeks a batch before set_epoch each epoch: its loop (line 81) is
    not named, and the loader without set_epoch is named once."""
    _, r, _ = cached("sampler_bugs.py", SAMPLER_BUGS)
    named = [f["evidence"].get("loop") for f in r["findings"] if f["code"] == "sampler-epoch-not-set"]
    assert named == ["sampler_bugs.py:56"], r["findings"]


@pytest.mark.slow
def test_straggler_made_with_sleep_is_named():
    _, r, _ = cached("straggler.py", "dist --nproc-per-node 2 --timeout 60 --out {tmp} -- 0.03")
    assert codes(r) == ["rank-straggler"], r["findings"]
    f = only(r, "rank-straggler")
    assert f["evidence"]["rank"] == 1 and f["title"].startswith("rank 1 is a straggler")
    assert f["evidence"]["median_lag_ms"] > 20


@pytest.mark.slow
def test_hang_names_the_rank_that_skipped_and_the_line_and_leaves_no_process():
    p, r, tmp_path = cached("hang.py", "dist --nproc-per-node 2 --timeout 20 --out {tmp}")  # 12 s was not always enough for two ranks to start at load 5
    wall = p.wall
    assert p.returncode == 1 and r["status"] == "timeout"
    assert codes(r) == ["collective-hang"], r["findings"]
    f = only(r, "collective-hang")
    assert "rank 1 skipped all_reduce at hang.py:26 after 3 optimizer steps" in f["title"]
    assert f["evidence"]["waiting"]["rank 0"] == "all_reduce at hang.py:26"
    assert f["evidence"]["waiting"]["rank 1"] == "barrier at hang.py:29"
    assert wall < 20 + 30, wall
    assert (tmp_path / "run" / "rank1" / "stacks.txt").stat().st_size > 0
    # the Flight Recorder variables the launch added, stated (gloo makes no pipe: none poked)
    fr = r["metrics"]["run"]["flight_recorder"]
    assert fr["pipe"] == str(tmp_path / "run" / "fr_pipe_") and "poked" not in fr
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE"} <= set(fr["set"])
    assert_no_rank_left(tmp_path)


@pytest.mark.slow
def test_shape_mismatch_is_named_with_both_shapes():
    p, r, tmp_path = cached("mismatch.py", "dist --nproc-per-node 2 --timeout 40 --out {tmp}")
    assert p.returncode == 1
    assert codes(r) == ["collective-mismatch"], r["findings"]  # the abort/reset are its symptoms
    f = only(r, "collective-mismatch")
    assert "all_reduce at mismatch.py:27" in f["title"]
    assert f["evidence"]["shapes"] == {"rank 0": "[4] float32", "rank 1": "[8] float32"}
    assert_no_rank_left(tmp_path)


# --------------------------------------------------------------------------- usage (fast)
def test_bad_nproc_and_selftest_options_with_a_script_are_usage_errors():
    from conftest import run_main  # in-process: no child needed to give these

    p = run_main("checkup", "--nproc-per-node", "0", "x.py")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = run_main("dist", "--backend", "gloo", str(DIST / "healthy_ddp.py"))
    assert p.returncode == 2 and "self-test" in p.stderr and "Traceback" not in p.stderr
    p = run_main("dist", "--nproc-per-node", "2", "missing.py")
    assert p.returncode == 2 and "script not found" in p.stderr


# --------------------------------------------------------------------------- NCCL (2+ GPUs)
@pytest.mark.multigpu
def test_nccl_healthy_ddp_raises_no_warning(tmp_path):
    p, r = dist_run(tmp_path, "healthy_ddp.py", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert codes(r) == [], r["findings"]
    assert r["context"]["device"].startswith("cuda")
    assert_no_rank_left(tmp_path)


@pytest.mark.multigpu
def test_nccl_straggler_is_named(tmp_path):
    _, r = dist_run(tmp_path, "straggler.py", "0.03", timeout=120)
    assert codes(r) == ["rank-straggler"], r["findings"]
    assert only(r, "rank-straggler")["evidence"]["rank"] == 1


@pytest.mark.multigpu
@pytest.mark.slow
def test_nccl_healthy_ddp_never_names_a_straggler_in_20_runs(tmp_path):
    """Issue 27 item 7 acceptance on NCCL: a by-the-book DDP script raised rank-straggler in 3 of 9
    runs on 2xH200 (2.1-2.5 ms of device time outside backward in a 3.7 ms step). 0 in 20 now
    (TD_NCCL_RUNS overrides the count); the 30 ms straggler is still named (test above)."""
    import os

    runs = int(os.environ.get("TD_NCCL_RUNS", "20"))
    named, lags = [], []
    for i in range(runs):
        p, r = dist_run(tmp_path / f"run{i}", "healthy_ddp.py", timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        per = (r["metrics"].get("ranks") or {}).get("per_rank") or []
        lags.append(max((abs(x.get("median_lag_ms") or 0.0) for x in per), default=0.0))
        if "rank-straggler" in codes(r):
            named.append((i, only(r, "rank-straggler")["evidence"]))
        assert_no_rank_left(tmp_path / f"run{i}")
    assert named == [], (named, lags)


@pytest.mark.multigpu
def test_nccl_hang_is_diagnosed_within_timeout_plus_30s_and_no_rank_survives(tmp_path):
    t0 = time.monotonic()
    p, r = dist_run(tmp_path, "hang.py", timeout=40)
    wall = time.monotonic() - t0
    assert p.returncode == 1 and r["status"] == "timeout"
    assert codes(r) == ["collective-hang"], r["findings"]
    f = only(r, "collective-hang")
    assert "rank 1 skipped all_reduce at hang.py:26" in f["title"]
    assert wall < 40 + 30, wall
    # each NCCL rank made its Flight Recorder pipe in the run dir; the timeout poked both; the
    # pipes are gone after the run (torch never removes them)
    fr = r["metrics"]["run"]["flight_recorder"]
    assert sorted(fr.get("poked", {}).values()) == ["written", "written"], fr
    assert not list((tmp_path / "run").glob("fr_pipe_*.pipe"))
    assert_no_rank_left(tmp_path)
