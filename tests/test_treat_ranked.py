"""treat --nproc-per-node N (issue 29 item 4): the ranked plan on synthetic surveys, the ranked
trial run (slowest rank, per-rank losses, a crashing rank), and end to end on 2 gloo ranks (DDP's
bucket trial; a rank crashing under it); FSDP2 on 2 GPUs (multigpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchdoctor.treat.catalogue import CATALOGUE, parse_try
from torchdoctor.treat.plan import plan
from torchdoctor.treat.ranked_plan import bucket_target, ranked_plan

HERE = Path(__file__).resolve().parent
TREAT = HERE / "fixtures" / "scripts" / "treat"

BASE_SURVEY = {"cpus": 4, "loaders": [], "zero_grad_false": [],
               "optimizers": [{"cls": "AdamW", "module": "torch.optim.adamw", "fused": None}],
               "models": [{"cls": "Net", "has_conv": True, "dtypes": ["float32"], "autocast": False,
                           "channels_last": False, "compiled": False, "shapes_vary": False}],
               "flags": {"float32_matmul_precision": "highest"}, "device": {"cuda": True, "bf16": True}}


def _ddp(param_mb: float, cap: float = 25.0) -> dict:
    return {**BASE_SURVEY, "parallel": {"backend": "nccl", "world_size": 2, "fsdp2": [], "ddp": [
        {"site": "t.py:9", "bucket_cap_mb": cap, "bucket_cap_mb_list": False,
         "param_bytes": int(param_mb * 2**20), "device": "cuda"}]}}


def _fsdp2(calls: int = 5, param_dtype=None) -> dict:
    rows = [{"site": f"t.py:{10 + i}", "module": "Block" if i < calls - 1 else "Net",
             "param_dtype": param_dtype, "reduce_dtype": None, "dtypes": ["float32"]} for i in range(calls)]
    return {**BASE_SURVEY, "optimizers": [{**BASE_SURVEY["optimizers"][0], "dtensor": True}],
            "parallel": {"backend": "nccl", "world_size": 2, "ddp": [], "fsdp2": rows}}


def _lines(p) -> tuple[dict, dict]:
    return {t.name: t.why for t in p.trials}, dict(p.skipped)


def test_every_treatment_gets_one_line_in_the_ranked_plan():
    for survey, cuda in ((_ddp(32), True), (_fsdp2(), True), (_fsdp2(), False), (BASE_SURVEY, False)):
        p = ranked_plan(survey, [], on_cuda=cuda, nproc=2)
        names = [t.name for t in p.trials] + [n for n, _ in p.skipped]
        assert sorted(names) == sorted(t.name for t in CATALOGUE)


def test_ddp_whose_gradients_fill_several_buckets_gets_the_bucket_trial_on_cpu_too():
    trials, skipped = _lines(ranked_plan(_ddp(32), [], on_cuda=False, nproc=2))
    assert trials["ddp-bucket-cap"] == "32 MiB of gradients in buckets of 25 MiB: at least 2 all-reduces a step"
    assert skipped["fsdp-bf16"] == skipped["compile-blocks"] == "no fully_shard (FSDP2) call"
    # channels-last after DDP built its buckets is not the fix: out of the plan, with why
    assert skipped["channels-last"].startswith("not a valid trial on a data-parallel model:")
    assert "before wrapping in DDP" in skipped["channels-last"]
    assert bucket_target(_ddp(32), None) == 100.0 and bucket_target(_ddp(32), "64") == 64.0


def test_ddp_that_fits_one_bucket_or_has_big_buckets_is_not_tried():
    _, skipped = _lines(ranked_plan(_ddp(8), [], on_cuda=True, nproc=2))
    assert "fit in one bucket" in skipped["ddp-bucket-cap"]
    _, skipped = _lines(ranked_plan(_ddp(300, cap=200), [], on_cuda=True, nproc=2,
                                    forced=[("ddp-bucket-cap", "150")]))
    assert skipped == {"ddp-bucket-cap": "bucket_cap_mb already >= 150"}


def test_fsdp2_on_cuda_plans_its_own_trials_and_keeps_the_invalid_one_process_ones_out():
    trials, skipped = _lines(ranked_plan(_fsdp2(), [], on_cuda=True, nproc=2))
    assert {"fsdp-bf16", "compile-blocks", "fused-optimizer", "tf32"} <= set(trials)
    assert trials["fsdp-bf16"] == "CUDA: FSDP2 all-gathers and computes in float32"
    assert trials["fused-optimizer"] == "CUDA: the optimizer holds DTensor parameters (FSDP2's shards)"
    for name, word in (("bf16-autocast", "fsdp-bf16"), ("compile", "compile-blocks"),
                       ("channels-last", "before fully_shard")):
        assert skipped[name].startswith("not a valid trial on a data-parallel model:"), name
        assert word in skipped[name], name
    assert skipped["ddp-bucket-cap"] == "no DistributedDataParallel built"
    # asked for by name, an invalid one stays out too
    _, skipped = _lines(ranked_plan(_fsdp2(), [], on_cuda=True, nproc=2, forced=[("bf16-autocast", None)]))
    assert skipped["bf16-autocast"].startswith("not a valid trial")


def test_fsdp2_on_cpu_lists_the_cuda_trials_as_not_tried_with_the_reason():
    trials, skipped = _lines(ranked_plan(_fsdp2(), [], on_cuda=False, nproc=2))
    assert trials == {}
    assert skipped["fsdp-bf16"] == "no CUDA; `--try fsdp-bf16` runs it on CPU"
    assert skipped["fused-optimizer"] == "no CUDA; `--try fused-optimizer` runs it on CPU"
    assert skipped["tf32"] == "no CUDA"
    trials, _ = _lines(ranked_plan(_fsdp2(), [], on_cuda=False, nproc=2,
                                   forced=[("fsdp-bf16", None), ("compile-blocks", "eager")]))
    assert trials == {"fsdp-bf16": "--try", "compile-blocks": "--try"}


def test_fsdp2_with_its_own_policy_or_only_a_root_is_not_tried():
    _, skipped = _lines(ranked_plan(_fsdp2(param_dtype="bfloat16"), [], on_cuda=True, nproc=2))
    assert skipped["fsdp-bf16"] == "every fully_shard call sets a MixedPrecisionPolicy param_dtype already"
    _, skipped = _lines(ranked_plan(_fsdp2(calls=1), [], on_cuda=True, nproc=2))
    assert skipped["compile-blocks"].startswith("fully_shard on one module only")
    s = _fsdp2()
    s["device"] = {"cuda": True, "bf16": False}
    assert dict(ranked_plan(s, [], on_cuda=True, nproc=2).skipped)["fsdp-bf16"] == "this GPU does not support bf16"


def test_a_reorder_trial_on_an_fsdp2_model_computing_in_bf16_gets_the_bf16_tolerance():
    from torchdoctor.treat.catalogue import BF16, BY_NAME, REORDER
    from torchdoctor.treat.plan import tolerance_for

    assert tolerance_for(BY_NAME["fused-optimizer"], _fsdp2()) == REORDER
    assert tolerance_for(BY_NAME["fused-optimizer"], _fsdp2(param_dtype="bfloat16")) == BF16
    assert tolerance_for(BY_NAME["ddp-bucket-cap"], _ddp(32)) == REORDER


def test_a_baseline_that_did_not_train_plans_nothing():
    p = ranked_plan(_ddp(32), [], on_cuda=False, nproc=2, baseline_failure="rank 1: RuntimeError: x")
    assert p.trials == [] and all(r == "the baseline did not train: rank 1: RuntimeError: x"
                                  for _, r in p.skipped)


def test_dataloader_workers_counts_the_cores_of_each_rank():
    s = {**_ddp(8), "cpus": 8, "loaders": [{"num_workers": 2, "iterable": False, "pin_memory": True}]}
    _, skipped = _lines(ranked_plan(s, ["dataloader-bound"], on_cuda=True, nproc=4))
    assert skipped["dataloader-workers"] == "num_workers already >= 2 (of 2 CPUs)"


def test_one_process_plan_leaves_the_ranked_trials_out_unless_asked():
    p = plan(BASE_SURVEY, [], on_cuda=True)
    names = [t.name for t in p.trials] + [n for n, _ in p.skipped]
    assert not {"ddp-bucket-cap", "fsdp-bf16", "compile-blocks"} & set(names)
    p = plan(BASE_SURVEY, [], on_cuda=True, forced=[("ddp-bucket-cap", None)])
    assert p.trials == [] and "--nproc-per-node N" in dict(p.skipped)["ddp-bucket-cap"]


def test_try_ddp_bucket_cap_takes_a_size_in_mib():
    assert parse_try("ddp-bucket-cap=100") == ("ddp-bucket-cap", "100")
    with pytest.raises(ValueError, match="bucket size in MiB"):
        parse_try("ddp-bucket-cap=big")
    with pytest.raises(ValueError, match="takes no value"):
        parse_try("fsdp-bf16=1")


# ---- the ranked trial run ---------------------------------------------------------------------
CHANGED = {"applied": [{"name": "ddp-bucket-cap", "changes": [
    {"what": "DistributedDataParallel", "where": "/x/t.py:9", "code": "DistributedDataParallel(..., bucket_cap_mb=100)"}],
    "notes": []}]}


def _rank(step_ms, losses=None, result=None, errors=(), treatment=None):
    from torchdoctor.evidence import Evidence
    from torchdoctor.trials import TrialRun, Variation

    ev = [{"kind": "step", "step": i, "wall_s": ms / 1e3, "data_s": 0.0} for i, ms in enumerate(step_ms, 1)]
    ev.append({"kind": "loss_trace", "steps": list(range(1, len(step_ms) + 1)),
               "losses": losses or [1.0 / i for i in range(1, len(step_ms) + 1)]})
    ev.append({"kind": "peak_memory", "host_rss": 100 * 2**20})
    ev += [{"kind": "treatment_error", "name": "fsdp-bf16", "error": e} for e in errors]
    if treatment is not None:
        ev.append({"kind": "treatment", **treatment})
    return TrialRun(Variation("v"), 0, Evidence.from_events(ev, meta={"argv": ["t.py"]},
                                                           result=result or {"outcome": "stopped"}), 1.0)


def _ranked(per, result=None):
    from torchdoctor.trials import Variation
    from torchdoctor.trials.ranked import RankedTrialRun

    return RankedTrialRun(Variation("v"), 0, per[min(per)].evidence if per else None, 1.0, per=per,
                          result=result or {"outcome": "stopped"}, nproc=2)


def test_a_ranked_run_is_timed_on_its_slowest_rank():
    r = _ranked({0: _rank([50] + [10.0] * 5), 1: _rank([50] + [12.0] * 5)})
    assert r.slowest_rank() == 1 and r.median_ms() == pytest.approx(12.0)
    assert r.failure() is None
    assert r.time_basis().endswith("the slowest of 2 ranks")


def test_a_rank_that_crashed_is_the_trials_failure_with_its_error():
    crash = {"outcome": "crash", "exception": {"type": "RuntimeError", "message": "planted\nmore",
                                               "user_frame": {"file": "t.py", "line": 31}}}
    stopped = {"outcome": "signal", "signal": "SIGTERM", "stopped_by_launcher": True}
    r = _ranked({0: _rank([10.0] * 2, result=stopped), 1: _rank([10.0] * 2, result=crash)},
                result={"outcome": "crash", "failed_rank": 1})
    assert r.failure() == "rank 1: RuntimeError: planted at t.py:31"
    # the launch named no rank: the one that failed on its own, not the one torchrun stopped
    r = _ranked({0: _rank([10.0] * 2, result=stopped), 1: _rank([10.0] * 2, result=crash)},
                result={"outcome": "crash"})
    assert r.failure().startswith("rank 1: RuntimeError")
    r = _ranked({0: _rank([10.0] * 2)}, result={"outcome": "timeout", "timeout_s": 30})
    assert r.failure() == "timed out after 30 s (all 2 ranks stopped)"
    r = _ranked({0: _rank([10.0] * 2)}, result={"outcome": "crash"})
    assert r.failure() == "rank 1 did not start (crash)"


def test_a_treatment_that_raised_on_one_rank_fails_the_trial_with_that_rank():
    from torchdoctor.treat.measure import trial_entry

    base = [_ranked({0: _rank([10.0] * 4), 1: _rank([10.0] * 4)}) for _ in range(2)]
    treated = [_ranked({0: _rank([10.0] * 4), 1: _rank([10.0] * 4, errors=["RuntimeError: no FSDP2"])})]
    e = trial_entry("fsdp-bf16", "x", base, treated, tolerance=0.05, intent="speed")
    assert e["verdict"] == "failed" and e["reason"] == "rank 1: the treatment raised: RuntimeError: no FSDP2"


def test_the_loss_is_checked_rank_by_rank_and_the_worst_rank_decides():
    from torchdoctor.treat.measure import trial_entry

    ok = [1.0, 0.9, 0.8, 0.7]
    base = [_ranked({0: _rank([10.0] * 4, ok), 1: _rank([10.0] * 4, [2.0, 1.8, 1.6, 1.4])}) for _ in range(2)]
    # rank 0 identical, rank 1 drifts 10 %: rejected on rank 1's loss (rank 0's alone would pass)
    treated = [_ranked({0: _rank([5.0] * 4, ok, treatment=CHANGED),
                        1: _rank([5.0] * 4, [2.0, 1.8, 1.6, 1.54], treatment=CHANGED)}) for _ in range(2)]
    e = trial_entry("ddp-bucket-cap", "x", base, treated, tolerance=1e-3, intent="speed")
    assert e["verdict"] == "reject" and e["loss_ok"] is False
    assert e["loss_max_rel_diff"] == pytest.approx(0.14 / 1.54, rel=1e-3)
    assert e["loss_note"].startswith("loss checked on each of 2 ranks, worst: rank 1")
    treated = [_ranked({0: _rank([5.0] * 4, ok, treatment=CHANGED),
                        1: _rank([5.0] * 4, [2.0, 1.8, 1.6, 1.4], treatment=CHANGED)}) for _ in range(2)]
    e = trial_entry("ddp-bucket-cap", "x", base, treated, tolerance=1e-3, intent="speed")
    assert e["loss_ok"] is True and e["speedup"] == 2.0 and e["verdict"] == "adopt"
    assert e["slowest_ranks"] == {"baseline": [0, 0], "treated": [0, 0]}  # equal: the lower rank
    assert e["fix"] == "ddp-bucket-cap: at /x/t.py:9: DistributedDataParallel(..., bucket_cap_mb=100)"


# ---- end to end on 2 gloo ranks (CPU) ----------------------------------------------------------
def _no_process_left(marker: str) -> list[str]:
    import psutil

    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in a for a in p.info["cmdline"] or []):
                left.append(" ".join(p.info["cmdline"]))
        except (psutil.Error, TypeError):
            continue
    return left


def _treat(tmp_path, *args, timeout=900):
    from conftest import run_cli

    p = run_cli("treat", "--nproc-per-node", 2, "--json", "--out", tmp_path / "out", *args,
                timeout=timeout, cwd=TREAT)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p, json.loads(p.stdout)


def test_ddp_bucket_trial_runs_on_two_gloo_ranks_and_gets_a_verdict(tmp_path):
    p, r = _treat(tmp_path, "--steps", 12, "--budget", 600, "ranked_ddp_buckets.py")
    assert p.returncode == 0, p.stderr[-3000:]
    trials = {t["name"]: t for t in r["metrics"]["trials"]}
    t = trials["ddp-bucket-cap"]
    assert t["why"].startswith("32 MiB of gradients in buckets of 25 MiB"), t
    assert t["verdict"] in ("adopt", "noise", "reject"), t
    assert t["rounds"] == {"baseline": 2, "treated": 2}
    assert t["setting"] == "DistributedDataParallel(bucket_cap_mb=100)"
    assert t["step_time_basis"].endswith("the slowest of 2 ranks")
    assert t["loss_ok"] is True and t["loss_note"].startswith("loss checked on each of 2 ranks, worst: rank")
    assert trials["channels-last"]["reason"].startswith("not a valid trial on a data-parallel model")
    assert r["metrics"]["treat"]["ranks"] == 2 and r["metrics"]["treat"]["wrapping"] == ["ddp"]
    assert r["metrics"]["treat"]["runs"] == 4
    # the treated ranks built DDP with the larger buckets at the script's own line
    ev = [json.loads(x) for x in next((tmp_path / "out").glob("trial-*-ddp-bucket-cap-0")).joinpath(
        "rank1", "events.jsonl").read_text().splitlines()]
    applied = [e for e in ev if e["kind"] == "treatment"][-1]["applied"][0]
    line = next(i for i, text in enumerate((TREAT / "ranked_ddp_buckets.py").read_text().splitlines(), 1)
                if text.startswith("model = DDP("))
    assert applied["changes"][0]["where"].endswith(f"ranked_ddp_buckets.py:{line}")
    assert applied["changes"][0]["code"] == "DistributedDataParallel(..., bucket_cap_mb=100)"
    assert _no_process_left(str(tmp_path)) == []


def test_a_rank_crashing_under_a_trial_is_that_trials_failure(tmp_path):
    p, r = _treat(tmp_path, "--steps", 6, "--budget", 600, "ranked_ddp_buckets.py", "--crash-on-big-buckets")
    assert p.returncode == 0, p.stderr[-3000:]
    t = {t["name"]: t for t in r["metrics"]["trials"]}["ddp-bucket-cap"]
    assert t["verdict"] == "failed", t
    assert t["reason"].startswith("rank 1: RuntimeError: planted: rank 1 refuses buckets over 50 MiB"), t
    assert t["rounds"]["treated"] == 0 and r["metrics"]["treat"]["runs"] == 3  # not run again
    assert _no_process_left(str(tmp_path)) == []


def test_a_trial_whose_ranks_hang_is_stopped_at_the_timeout_and_leaves_no_process(tmp_path):
    p, r = _treat(tmp_path, "--steps", 6, "--timeout", 100, "--budget", 900, "ranked_ddp_buckets.py",
                  "--hang-on-big-buckets")
    assert p.returncode == 0, p.stderr[-3000:]
    t = {t["name"]: t for t in r["metrics"]["trials"]}["ddp-bucket-cap"]
    assert t["verdict"] == "failed", t
    assert t["reason"] == "timed out after 100.0 s (all 2 ranks stopped)", t
    assert t["rounds"] == {"baseline": 2, "treated": 0}
    assert _no_process_left(str(tmp_path)) == []


def test_ctrl_c_during_a_ranked_trial_stops_every_rank_and_prints_what_ran(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.Popen([sys.executable, "-m", "torchdoctor", "treat", "--nproc-per-node", "2", "--json",
                          "--steps", "6", "--out", str(tmp_path / "out"), "ranked_ddp_buckets.py",
                          "--hang-on-big-buckets"], cwd=TREAT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_lines: list[str] = []
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:  # the baseline's progress line: the trial's launch starts now
        line = p.stderr.readline()
        if not line:
            break
        err_lines.append(line)
        if "baseline (round 1)" in line:
            break
    marker = tmp_path / "out"
    while time.monotonic() < deadline and not list(marker.glob("trial-*-ddp-bucket-cap-0/rank1/events.jsonl")):
        time.sleep(0.5)  # rank 1 of the trial started its script
    time.sleep(8.0)  # ... and reached its hang at step 3 (rank 0 waits in the all-reduce)
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=180)
    err = "".join(err_lines) + rest
    assert p.returncode == 130, err[-2000:]
    r = json.loads(out)
    assert r["status"] == "interrupted" and r["metrics"]["treat"]["stopped"] == "interrupted"
    t = {t["name"]: t for t in r["metrics"]["trials"]}["ddp-bucket-cap"]
    assert t["verdict"] == "skipped" and t["reason"] == "not run: interrupted (Ctrl-C)", t
    assert "Traceback" not in out and "[3/" not in err
    assert _no_process_left(str(tmp_path)) == []


# ---- FSDP2 on 2 GPUs ---------------------------------------------------------------------------
@pytest.mark.multigpu
def test_fsdp2_trials_are_planned_and_measured_on_two_gpus(tmp_path):
    p, r = _treat(tmp_path, "--steps", 12, "--budget", 900, "ranked_fsdp2.py")
    assert p.returncode == 0, p.stderr[-3000:]
    trials = {t["name"]: t for t in r["metrics"]["trials"]}
    for name in ("fsdp-bf16", "compile-blocks", "fused-optimizer"):
        assert trials[name]["verdict"] in ("adopt", "noise", "reject"), trials[name]
        assert trials[name]["step_time_basis"].endswith("the slowest of 2 ranks")
    assert trials["bf16-autocast"]["reason"].startswith("not a valid trial")
    assert trials["compile"]["reason"].startswith("not a valid trial")
    assert trials["compile-blocks"]["compile_steps"]
    assert _no_process_left(str(tmp_path)) == []


# ---- the child side, in this process on a one-rank gloo group --------------------------------
@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_bucket_treatment_builds_ddp_with_larger_buckets_and_notes_the_line(one_rank):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchdoctor.treat.dist import DdpBucketCap

    orig = DDP.__init__
    a = DdpBucketCap(None)
    a.install(None)
    try:
        m = DDP(torch.nn.Linear(4, 4), bucket_cap_mb=10)  # the script's 10 MiB: 4x is 40
        line = __import__("inspect").currentframe().f_lineno - 1
        assert m.bucket_bytes_cap == 40 * 2**20
        assert a.changes == [{"what": "DistributedDataParallel", "where": f"{__file__}:{line}",
                              "code": "DistributedDataParallel(..., bucket_cap_mb=40)"}]
        big = DDP(torch.nn.Linear(4, 4), bucket_cap_mb_list=[1, 2])  # the script's own buckets: left alone
        assert big is not None and "bucket_cap_mb_list set by the script" in a.notes[0]
    finally:
        a.uninstall(None)
    assert DDP.__init__ is orig and DDP(torch.nn.Linear(4, 4)).bucket_bytes_cap == 25 * 2**20


def test_the_fsdp_bf16_treatment_gives_fully_shard_a_bf16_policy_and_the_survey_sees_both(one_rank):
    import sys

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch.distributed.fsdp as fsdp
    from torchdoctor.runner.patching import Patches
    from torchdoctor.treat.dist import FsdpBf16
    from torchdoctor.treat.dist_survey import DistSurvey

    orig = fsdp.fully_shard
    patches = Patches()
    survey = DistSurvey(patches, lambda: True)
    survey.install()
    a = FsdpBf16(None)
    a.install(None)
    try:
        from torch.distributed.fsdp import fully_shard  # as a script imports it: after the install

        assert sys.modules["torch.distributed._composable.fsdp"].fully_shard is fully_shard
        mesh = init_device_mesh("cpu", (1,))
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        fully_shard(net[0], mesh=mesh)
        fully_shard(net, mesh=mesh)
        assert net(torch.randn(2, 8)).dtype == torch.bfloat16
        assert [c["what"] for c in a.changes] == ["fully_shard", "fully_shard"]  # two lines of this test
        DDP(torch.nn.Linear(16, 16))
        survey.snapshot()
        rec = survey.record()
    finally:
        a.uninstall(None)
        patches.undo()
    assert fsdp.fully_shard is orig
    assert sys.modules["torch.distributed.fsdp._fully_shard"].fully_shard is orig
    assert [r["module"] for r in rec["fsdp2"]] == ["Linear", "Sequential"]
    assert rec["fsdp2"][0]["param_dtype"] == "bfloat16" and rec["fsdp2"][0]["dtypes"] == ["float32"]
    assert rec["ddp"][0]["bucket_cap_mb"] == 25.0 and rec["ddp"][0]["param_bytes"] == (16 * 16 + 16) * 4
    assert rec["backend"] == "gloo" and rec["world_size"] == 1


def test_compile_blocks_compiles_each_fsdp2_unit_below_the_root_and_undoes_it(one_rank):
    from types import SimpleNamespace

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torchdoctor.treat.dist import CompileBlocks

    mesh = init_device_mesh("cpu", (1,))
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    fully_shard(net[0], mesh=mesh)
    fully_shard(net[1], mesh=mesh)
    fully_shard(net, mesh=mesh)
    ctx = SimpleNamespace(step=0)
    a = CompileBlocks("eager")
    a.install(ctx)
    try:
        assert a.on_root(ctx, net, ()) is None
        assert a.on_root(ctx, net, ()) is None  # once per root
        assert [m._compiled_call_impl is not None for m in net] == [True, True, False]
        assert net._compiled_call_impl is None  # the root (its all-gather hooks) is left to FSDP2
        assert a.changes[0]["code"].startswith("block.compile(backend='eager')   # each fully_shard-ed block (2 here)")
        y = net(torch.randn(4, 8))
        assert y.shape == (4, 2)
    finally:
        a.uninstall(ctx)
    assert [m._compiled_call_impl for m in net] == [None, None, None]


def test_the_ranked_session_reads_its_ranks_from_run_options_or_a_mapping():
    # regression (session 10 merge): the command builds RunOptions; the session indexed it as a dict
    # ("'RunOptions' object is not subscriptable", an internal error on every ranked treat)
    from torchdoctor.pipeline.options import RunOptions
    from torchdoctor.treat.ranked_session import RankedTreatSession

    kw = {"budget_s": None, "forced": None}
    assert RankedTreatSession("t.py", [], RunOptions(nproc_per_node=2), **kw).nproc == 2
    assert RankedTreatSession("t.py", [], {"nproc_per_node": 3, "steps": 6}, **kw).nproc == 3
