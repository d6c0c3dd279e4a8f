"""`torchdoctor dist` end to end: real torchrun self-tests (2 gloo ranks on CPU; NCCL on 2+ GPUs)."""

import json
import os
import time
from pathlib import Path

import pytest

from torchdoctor.distributed.selftest import is_our_worker
from torchdoctor.findings import Report
from torchdoctor.report.console import render_to_text


def worker_pids(out: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in out.glob("rank*.json")]


def assert_no_worker_left(out: Path) -> None:
    pids = worker_pids(out)
    assert pids, "no rank file: the workers never started"
    assert not [p for p in pids if is_our_worker(p, out)], "a self-test rank survived"


# --------------------------------------------------------------------------- CPU / gloo (CI)
@pytest.mark.slow
def test_cpu_gloo_selftest_is_correct_and_silent(cli, tmp_path):
    t0 = time.monotonic()
    r = cli("dist", "--json", "--backend", "gloo", "--nproc-per-node", "2", "--out", tmp_path, timeout=120,
            env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    st = rep["metrics"]["dist"]["selftest"]
    assert st["status"] == "ok" and st["world_size"] == 2 and st["backend"] == "gloo"
    assert {c["op"]: c["ok"] for c in st["checks"]} == {"all_reduce": True, "all_gather": True,
                                                        "reduce_scatter": True, "broadcast": True}
    assert [row["bytes"] for row in st["sweep"]] == st["sizes"]
    assert all(row["busbw_gbs"] > 0 and len(row["rank_time_us"]) == 2 for row in st["sweep"])
    assert [f for f in rep["findings"] if f["severity"] != "info"] == []
    assert any(s["rule"] == "allreduce-bandwidth-low" and "NCCL" in s["reason"] for s in rep["skipped"])
    assert (tmp_path / "report.json").is_file() and (tmp_path / "dist-selftest" / "rank1.json").is_file()
    assert_no_worker_left(tmp_path / "dist-selftest")
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_cpu_selftest_timeout_is_reported_and_every_rank_is_gone(cli, tmp_path):
    r = cli("dist", "--json", "--backend", "gloo", "--timeout", "8", "--out", tmp_path, timeout=60,
            env={"TORCHDOCTOR_SELFTEST_FAULT": "stall", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)
    f = [f for f in rep["findings"] if f["code"] == "collective-selftest-failed"]
    assert f and "did not finish within the timeout" in f[0]["title"]
    assert f[0]["evidence"]["ranks"] == ["rank 0: init", "rank 1: init"]
    assert "selftest_worker.py" in f[0]["evidence"]["_stack"]  # where it was stuck
    assert rep["metrics"]["dist"]["selftest"]["processes_left"] is False
    assert_no_worker_left(tmp_path / "dist-selftest")


# --------------------------------------------------------------------------- usage (fast)
@pytest.mark.parametrize("args,needle", [
    (["train.py", "--lr", "1"], "script not found: train.py"),
    (["--backend", "mpi"], "--backend must be auto, nccl or gloo"),
    (["--sizes", "3"], "multiple of 4 bytes"),
    (["--sizes", "big"], "cannot read size"),
    (["--timeout", "0"], "--timeout must be positive"),
])
def test_usage_errors_exit_2(args, needle):
    from conftest import run_main

    r = run_main("dist", *args)  # in-process (`dist SCRIPT` checks the script inside its run)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_bad_nproc_and_nccl_without_gpu_exit_2(cli):
    from conftest import run_main

    r = run_main("dist", "--nproc-per-node", "0", "--backend", "gloo")  # in-process
    assert r.returncode == 2 and "at least 1" in r.stderr
    # a child: CUDA_VISIBLE_DEVICES is read when CUDA starts, which this process may have done
    r = cli("dist", "--backend", "nccl", env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "needs CUDA GPUs" in r.stderr


def test_no_selftest_audits_env_only():
    from conftest import run_main

    # in-process: the audit reads this process's environment (set for the call only), starts no rank
    r = run_main("dist", "--json", "--no-selftest", env={"RANK": "3", "WORLD_SIZE": "2", "NCCL_BLOCKING_WAIT": "1"})
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert sorted(f["code"] for f in rep["findings"]) == ["dist-env-inconsistent", "dist-env-inconsistent",
                                                          "nccl-env-risky", "nccl-env-risky"]
    assert "selftest" not in rep["metrics"]["dist"]


def test_console_sections_render_the_sweep():
    rep = Report(command="dist")
    rep.metrics["dist"] = {
        "backends": {"nccl": True, "gloo": True}, "nccl_version": "2.27.3", "launch": {}, "variables": {},
        "topology": {"available": True, "gpus": [{"index": 0, "name": "H100", "pcie": {"max_gen": 5, "max_width": 16},
                                                  "nvlink_links": 18, "nvlink_speed_mbps": 26562,
                                                  "nvlink_remote": ["switch"]}], "pairs": []},
        "link_capacity": {"gbs": 478.1, "kind": "nvlink", "basis": "18 NVLink links x 26.562 GB/s"},
        "selftest": {"backend": "nccl", "world_size": 2, "status": "ok", "wall_s": 20.0,
                     "checks": [{"op": "all_reduce", "ok": True}, {"op": "broadcast", "ok": False, "max_abs_err": 2.0}],
                     "sweep": [{"bytes": 1 << 30, "time_us": 3264.0, "algbw_gbs": 328.9, "busbw_gbs": 328.9}]}}
    text = render_to_text(rep)
    assert "Distributed environment" in text and "NVLink 18 links × 26.562 GB/s → switch" in text
    assert "1 GiB" in text and "328.90" in text and "69%" in text
    assert "✓ all_reduce" in text and "✗ broadcast (max err 2)" in text
    assert render_to_text(Report(command="env")).count("Collective self-test") == 0


# --------------------------------------------------------------------------- a broken rule
def _break_rule(monkeypatch, name):
    """Make the registered rule ``name`` raise, as a bug in it would."""
    import dataclasses

    from torchdoctor import judge

    def broken(ev):
        raise KeyError("oops")

    monkeypatch.setitem(judge._RULES, name, dataclasses.replace(judge.all_rules()[name], fn=broken))


def _dist_in_process(*args):
    from typer.testing import CliRunner

    from torchdoctor.cli import app

    res = CliRunner().invoke(app, ["dist", "--json", *args])
    return res.exit_code, json.loads(res.stdout)


def test_a_crashing_env_audit_rule_keeps_the_rest_of_the_report(monkeypatch):
    for k, v in {"RANK": "3", "WORLD_SIZE": "2", "NCCL_BLOCKING_WAIT": "1", "CUDA_VISIBLE_DEVICES": ""}.items():
        monkeypatch.setenv(k, v)
    _break_rule(monkeypatch, "dist-nccl-env")
    code, rep = _dist_in_process("--no-selftest")
    assert sorted(f["code"] for f in rep["findings"]) == ["dist-env-inconsistent", "dist-env-inconsistent",
                                                          "internal-error"]
    [bug] = [f for f in rep["findings"] if f["code"] == "internal-error"]
    assert bug["evidence"]["rule"] == "dist-nccl-env" and "oops" in bug["evidence"]["traceback"]
    assert rep["metrics"]["dist"]["variables"] == {"NCCL_BLOCKING_WAIT": "1"}
    assert code == 1  # the error findings' code, not 3: the report stands


def test_a_crashing_selftest_rule_keeps_the_rest_of_the_report(monkeypatch):
    from torchdoctor.distributed import selftest

    def wrong_values(nproc, out, backend, sizes, timeout_s):  # a finished gloo run, broadcast wrong on rank 1
        ranks = [{"rank": r, "world_size": 2, "backend": "gloo", "phase": "done", "error": None,
                  "checks": [{"op": op, "ok": not (r == 1 and op == "broadcast"), "max_abs_err": 0.0, "error": None}
                             for op in ("all_reduce", "broadcast")],
                  "sweep": [{"bytes": 1 << 16, "iters": 10, "rep_s": [0.001]}]} for r in range(nproc)]
        st = selftest.merge(ranks, nproc=nproc, backend=backend, sizes=[1 << 16])
        st.update(returncode=0, timed_out=False, wall_s=1.0)
        st["status"] = selftest.status_of(st)
        return st

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(selftest, "run_selftest", wrong_values)
    _break_rule(monkeypatch, "allreduce-bandwidth-low")
    code, rep = _dist_in_process("--backend", "gloo")
    assert sorted(f["code"] for f in rep["findings"]) == ["collective-selftest-failed", "internal-error"]
    assert "broadcast returned wrong values" in rep["findings"][0]["title"]
    assert [f["evidence"]["rule"] for f in rep["findings"] if f["code"] == "internal-error"] == [
        "allreduce-bandwidth-low"]
    assert rep["metrics"]["dist"]["selftest"]["status"] == "wrong"
    assert code == 1


# --------------------------------------------------------------------------- NCCL (2+ GPUs)
@pytest.mark.multigpu
def test_nccl_selftest_on_local_gpus(cli, tmp_path):
    r = cli("dist", "--json", "--out", tmp_path, timeout=400)
    rep = json.loads(r.stdout)
    d = rep["metrics"]["dist"]
    st = d["selftest"]
    assert st["backend"] == "nccl" and st["status"] == "ok", json.dumps(st)[:3000]
    assert all(c["ok"] for c in st["checks"])
    assert max(row["bytes"] for row in st["sweep"]) == 1 << 30
    assert d["topology"]["available"] and d["nccl_version"]
    assert not [f for f in rep["findings"] if f["severity"] in ("error", "warning")], rep["findings"]
    assert r.returncode == 0
    assert_no_worker_left(tmp_path / "dist-selftest")


@pytest.mark.multigpu
def test_nccl_hang_is_bounded_and_leaves_no_rank(cli, tmp_path):
    t0 = time.monotonic()
    r = cli("dist", "--json", "--timeout", "40", "--sizes", "1M", "--out", tmp_path, timeout=200,
            env={"TORCHDOCTOR_SELFTEST_FAULT": "hang"})
    took = time.monotonic() - t0
    rep = json.loads(r.stdout)
    assert r.returncode == 1
    f = [f for f in rep["findings"] if f["code"] == "collective-selftest-failed"]
    assert f, rep["findings"]
    assert any("check:all_reduce" in x for x in f[0]["evidence"]["ranks"])
    assert took < 40 + 30
    assert_no_worker_left(tmp_path / "dist-selftest")
    assert os.path.isdir(tmp_path / "dist-selftest")
