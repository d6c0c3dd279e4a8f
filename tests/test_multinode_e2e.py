"""Two simulated nodes on one host: two torchdoctor agents, a 127.0.0.1 c10d rendezvous, gloo,
one rank each (tests/fixtures/dist/node_ddp.py); and a node that never starts.

Each test is a real two-agent launch (≈ 15-40 s on the loaded 2-core CPU box): few and tiny.
The same behaviours have fast synthetic tests in tests/test_multinode.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT

HERE = ROOT / "tests" / "fixtures" / "dist"
SCRIPT = "node_ddp.py"


def free_port_pair() -> int:
    """A port P with P and P+1 free (the rendezvous and node 0's gather port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p >= 65534:
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair")


def agent(node_rank: int, port: int, out: Path, *, env=None, timeout=60, rdzv_timeout=20,
          nnodes=2, steps=12, gpu: bool = False, script: list[str] | None = None,
          slurm: bool = False) -> subprocess.Popen:
    """One node's torchdoctor. ``gpu``: this node sees GPU ``node_rank`` only (two GPUs of one
    host as two nodes); else no GPU (gloo)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update({"CUDA_VISIBLE_DEVICES": str(node_rank) if gpu else "", "COLUMNS": "120"})
    e.update(env or {})
    run = ["--steps", str(steps), SCRIPT] if script is None else script
    where = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", f"t{port}"]
    if slurm:  # the same, from the variables srun sets (one task per node)
        where = []
        e.update(SLURM_JOB_ID=f"{port}", SLURM_STEP_ID="0", SLURM_PROCID=str(node_rank),
                 SLURM_NNODES=str(nnodes), SLURM_NODEID=str(node_rank), SLURM_NTASKS=str(nnodes),
                 SLURM_JOB_NODELIST="localhost,nohost[2-9]", MASTER_PORT=str(port))
    cmd = [sys.executable, "-m", "torchdoctor", "dist", "--json", "--nproc-per-node", "1", *where,
           "--rdzv-timeout", str(rdzv_timeout), "--timeout", str(timeout),
           "--out", str(out / f"n{node_rank}"), *run]
    return subprocess.Popen(cmd, cwd=HERE, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(p: subprocess.Popen, limit: float = 150) -> tuple[int, dict, str]:
    out, err = p.communicate(timeout=limit)
    assert out.strip(), err[-3000:]
    return p.returncode, json.loads(out), err


def job(tmp_path: Path, env1=None, **kw) -> tuple[tuple, tuple]:
    port = free_port_pair()
    a0 = agent(0, port, tmp_path, **kw)
    time.sleep(0.5)  # node 0 first, as a launcher would: it hosts the rendezvous store
    a1 = agent(1, port, tmp_path, env=env1, **kw)
    r0, r1 = finish(a0), finish(a1)
    assert_nothing_left(tmp_path)
    return r0, r1


def assert_nothing_left(out: Path) -> None:
    """No process of ours survives: no rank (pid files) and no torchrun of these run dirs."""
    time.sleep(0.5)
    pids = [int(p.read_text()) for p in out.glob("n*/run/rank*/pid")]
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        assert not (str(out) in cmd), f"left running: {proc.info['pid']} {cmd[:200]}"
        assert proc.info["pid"] not in pids or str(out) not in cmd


def serious(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] in ("error", "warning")]


@pytest.mark.slow
def test_two_healthy_nodes_give_one_job_report_without_warning(tmp_path):
    (rc0, r0, err0), (rc1, r1, err1) = job(tmp_path)
    assert rc0 == 0 and rc1 == 0, (err0[-2000:], err1[-2000:])
    assert serious(r0) == [], r0["findings"]
    nodes = r0["metrics"]["nodes"]
    assert len(nodes) == 2 and all(n["reported"] for n in nodes)
    assert sorted(r for n in nodes for r in n["ranks"]) == [0, 1]
    assert all(n["median_step_ms"] > 0 for n in nodes)
    assert [row["node"] for row in r0["metrics"]["ranks"]["per_rank"]] in ([0, 1], [1, 0])
    assert r1["metrics"]["node"]["job_report"] == "printed by node 0 (127.0.0.1)"
    assert r1["metrics"]["node"]["sent"] is True and "nodes" not in r1["metrics"]
    for k, r in ((0, r0), (1, r1)):  # each node's launch states the Flight Recorder it added
        assert r["metrics"]["run"]["flight_recorder"]["pipe"] == str(tmp_path / f"n{k}" / "run" / "fr_pipe_")


@pytest.mark.slow
def test_a_slow_node_is_named_by_the_straggler_finding(tmp_path):
    (rc0, r0, err0), _ = job(tmp_path, env1={"NODE_SLOW_S": "0.03"})
    [f] = [f for f in r0["findings"] if f["code"] == "rank-straggler"]
    n1 = next(n for n in r0["metrics"]["nodes"] if n["node_rank"] == 1)
    assert f["title"].startswith(f"rank {n1['ranks'][0]} (node 1) is a straggler"), f["title"]
    assert list(f["evidence"]["nodes"].values()) == [f"node 1 ({n1['hostname']})"]


@pytest.mark.slow
def test_a_debug_variable_on_one_node_is_a_mismatch_with_both_values(tmp_path):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL on one node only makes init_process_group wait for a
    helper group the other node never creates: the job hangs, and the report says why."""
    (rc0, r0, err0), _ = job(tmp_path, env1={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=20)
    [f] = [f for f in r0["findings"] if f["code"] == "node-env-mismatch"]
    assert "TORCH_DISTRIBUTED_DEBUG is (unset) on node 0 but 'DETAIL' on node 1" in f["title"]
    if any(g["code"] == "collective-hang" for g in r0["findings"]):  # (under load: still importing)
        assert "collective-hang" in f["evidence"]["also_in_this_report"], r0["findings"]
    assert f["evidence"]["differences"]["TORCH_DISTRIBUTED_DEBUG"] == {
        "node 0 (" + r0["metrics"]["nodes"][0]["hostname"] + ")": "(unset)",
        "node 1 (" + r0["metrics"]["nodes"][1]["hostname"] + ")": "DETAIL"}


@pytest.mark.slow
def test_a_node_that_never_starts_is_one_finding_at_the_rendezvous_timeout(tmp_path):
    """Started as srun would (SLURM_* only, no --nnodes): node 1 of 2 never comes."""
    port = free_port_pair()
    t0 = time.monotonic()
    rc, r, err = finish(agent(0, port, tmp_path, rdzv_timeout=4, slurm=True))
    took = time.monotonic() - t0
    assert [(f["code"], f["severity"]) for f in r["findings"]] == [("node-never-joined", "error")]
    assert r["findings"][0]["evidence"]["missing_nodes"] == [1]
    assert rc == 1 and took < 40, took
    assert r["metrics"]["nodes"][1] == {"node_rank": 1, "reported": False}
    assert r["metrics"]["job"]["source"] == "slurm"
    assert r["metrics"]["job"]["rdzv_endpoint"] == f"localhost:{port}"
    assert_nothing_left(tmp_path)


# --------------------------------------------------------------------------- GPUs (device box)
@pytest.mark.multigpu
def test_two_gpus_as_two_nodes_over_nccl(tmp_path):
    """Each "node" sees one GPU (CUDA_VISIBLE_DEVICES): one job over NCCL, one job report."""
    (rc0, r0, err0), (rc1, r1, err1) = job(tmp_path, gpu=True, timeout=120)
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    assert serious(r0) == [], r0["findings"]
    nodes = r0["metrics"]["nodes"]
    assert len(nodes) == 2 and all(n["gpu"] and n["median_step_ms"] > 0 for n in nodes), nodes
    assert r0["metrics"]["ranks"]["lag_basis"] == "device"


@pytest.mark.multigpu
def test_selftest_across_two_gpu_nodes_measures_between_nodes_and_names_the_transport(tmp_path):
    (rc0, r0, err0), (rc1, r1, err1) = job(tmp_path, gpu=True, timeout=180,
                                           script=["--sizes", "1M,64M,256M"])
    assert rc0 == 0 and rc1 == 0, (err0[-3000:], err1[-3000:])
    st = r0["metrics"]["dist"]["selftest"]
    assert st["status"] == "ok" and st["world_size"] == 2 and st["ranks_reported"] == 2
    assert st["nodes"]["inter_busbw_gbs"] > 0
    t = st["transport"]
    assert t["network"] in ("IB", "Socket") or t["paths"], t
    print("transport:", json.dumps(t), "inter-node busbw:", st["nodes"]["inter_busbw_gbs"], "GB/s")
