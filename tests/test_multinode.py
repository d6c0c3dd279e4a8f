"""Multi-node jobs: options, Slurm, the cross-node rules, node 0's job report (fast, synthetic).

The end-to-end runs (two agents on one host) are in tests/test_multinode_e2e.py.
"""

from __future__ import annotations

import io
import json

import pytest

from torchdoctor.distributed.jobreport import job_report, node_section
from torchdoctor.distributed.multinode import NodeSpec, resolve
from torchdoctor.distributed.slurm import NodeListError, expand_nodelist, slurm_nodes
from torchdoctor.distributed.torchrun import RankSet, parse_failures
from torchdoctor.errors import DoctorError
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.judge import judge

SRUN = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_NNODES": "4",
        "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-09,12]", "SLURM_NTASKS": "4"}


# ------------------------------------------------------------------ Slurm
@pytest.mark.parametrize("text,hosts", [
    ("node[01-04]", ["node01", "node02", "node03", "node04"]),
    ("a[1-3,7],b5", ["a1", "a2", "a3", "a7", "b5"]),
    ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
    ("login1", ["login1"]),
    ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"]),
    ("x[098-101],y", ["x098", "x099", "x100", "x101", "y"]),
])
def test_slurm_node_list_expands_like_scontrol_show_hostnames(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("bad", ["node[01-", "node01]", "node[4-2]", "node[a-b]", "", "n[1-2", "n[²-3]", "n[²]"])
def test_malformed_node_list_is_refused(bad):
    with pytest.raises(NodeListError):
        expand_nodelist(bad)


def test_srun_task_gives_the_multi_node_options():
    sl = slurm_nodes(SRUN)
    assert sl == {"nnodes": 4, "node_rank": 2, "rdzv_id": "4242", "rdzv_endpoint": "gpu07:29500",
                  "tasks": 4}
    assert slurm_nodes({**SRUN, "MASTER_PORT": "31000"})["rdzv_endpoint"] == "gpu07:31000"
    assert slurm_nodes({k: v for k, v in SRUN.items() if k not in ("SLURM_PROCID", "SLURM_STEP_ID")}) is None
    assert slurm_nodes({**SRUN, "SLURM_NNODES": "1"}) is None


def test_resolve_from_slurm_and_from_options():
    spec = resolve(None, None, None, None, None, None, None, env=SRUN)
    assert (spec.nnodes, spec.node_rank, spec.rdzv_endpoint, spec.rdzv_id, spec.source) == \
        (4, 2, "gpu07:29500", "4242", "slurm")
    spec = resolve(2, 1, "10.0.0.1:29400", None, "job7", 12, 0, env={})
    assert spec.torchrun_args() == ["--nnodes=2", "--rdzv-backend=c10d",
                                    "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=job7",
                                    "--rdzv-conf=join_timeout=12"]
    static = resolve(2, 1, "h:29400", "static", None, 7.5, None, env={})
    assert static.torchrun_args() == ["--nnodes=2", "--node-rank=1", "--rdzv-backend=static",
                                      "--rdzv-endpoint=h:29400", "--rdzv-id=torchdoctor",
                                      "--rdzv-conf=timeout=8"]
    assert spec.gather_port({}) == 29401 and spec.gather_port({"TORCHDOCTOR_GATHER_PORT": "5000"}) == 5000
    for bad in ("²", "70000", "0"):  # not a port: the default, not a crash
        assert spec.gather_port({"TORCHDOCTOR_GATHER_PORT": bad}) == 29401
    assert resolve(None, None, None, None, None, None, None, env={}) is None  # one node


@pytest.mark.parametrize("args,msg", [
    ((2, 2, "h:1", None, None, None, None), "--node-rank must be in 0..1"),
    ((2, None, "h:1", None, None, None, None), "needs --node-rank"),
    ((2, 0, None, None, None, None, None), "needs --rdzv-endpoint"),
    ((2, 0, "h", None, None, None, None), "HOST:PORT"),
    ((2, 0, "host:²", None, None, None, None), "HOST:PORT"),  # "²".isdigit(), but int() refuses it
    ((2, 0, "[::1]:²", None, None, None, None), "HOST:PORT"),
    ((2, 0, "h:1", None, "job²", None, None), "--rdzv-id"),
    ((2, 0, "h:1", "etcd", None, None, None), "--rdzv-backend"),
    ((2, 0, "h:1", None, None, None, 3), "--max-restarts must be 0"),
    ((2, 0, "h:1", None, "a b", None, None), "--rdzv-id"),
    ((None, 1, None, None, None, None, None), "need --nnodes"),
])
def test_unfit_options_are_usage_errors(args, msg):
    with pytest.raises(DoctorError, match=msg):
        resolve(*args, env={})


def test_srun_with_several_tasks_per_node_is_refused():
    with pytest.raises(DoctorError, match="one task per node"):
        resolve(None, None, None, None, None, None, None, env={**SRUN, "SLURM_NTASKS": "32"})


def test_torchrun_gets_the_rendezvous_instead_of_standalone(tmp_path):
    spec = NodeSpec(nnodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29500")
    cmd = RankSet(tmp_path, 4, node=spec).command(["python", "-c", "pass"])
    assert "--standalone" not in cmd and "--rdzv-endpoint=127.0.0.1:29500" in cmd
    assert "--max-restarts=0" in cmd and "--nproc-per-node=4" in cmd
    env = RankSet(tmp_path, 4, node=spec).env({})
    assert env["TORCHDOCTOR_NODE_RANK"] == "1"


def test_torchrun_failure_summary_by_local_rank_on_a_node():
    lines = ["Root Cause (first observed failure):", "[0]:", "  rank      : 5 (local_rank: 1)",
             "  exitcode  : 1 (pid: 9)"]
    assert parse_failures(lines) == {5: {"exitcode": 1, "root_cause": True}}
    assert parse_failures(lines, local=True) == {1: {"exitcode": 1, "root_cause": True}}


# ------------------------------------------------------------------ cross-node rules
def node_view(summaries, **meta):
    base = {"nnodes": 2, "view_node": 0, "rdzv_endpoint": "h:1", "rdzv_timeout": 5.0,
            "gather_wait_s": 30.0, "gather_port": 2, "rendezvous_failed": False}
    evs = [{"kind": "node_summary", "node_rank": k, **s} for k, s in summaries.items()]
    rep = Report(command="dist")
    judge("nodes", Evidence.from_events(evs, meta={**base, **meta}), rep)
    return rep


def facts(host, **kw):
    return {"hostname": host, "torch": "2.11.0", "cuda": "13.0", "nccl": "2.28.9",
            "driver": "580.1", "gpu": "NVIDIA H100", "env": kw}


def test_env_mismatch_names_the_variable_and_both_values():
    rep = node_view({0: {"facts": facts("a")}, 1: {"facts": facts("b", TORCH_DISTRIBUTED_DEBUG="DETAIL")}})
    [f] = rep.findings
    assert f.code == "node-env-mismatch" and f.severity == "warning"
    assert "TORCH_DISTRIBUTED_DEBUG" in f.title and "(unset) on node 0" in f.title
    assert "'DETAIL' on node 1" in f.title
    assert f.evidence["differences"]["TORCH_DISTRIBUTED_DEBUG"] == {"node 0 (a)": "(unset)",
                                                                    "node 1 (b)": "DETAIL"}


def test_version_and_gpu_differences_are_mismatches_too():
    f1 = {**facts("b"), "nccl": "2.21.5", "gpu": "NVIDIA A100"}
    [f] = node_view({0: {"facts": facts("a")}, 1: {"facts": f1}}).findings
    assert set(f.evidence["differences"]) == {"NCCL version", "GPU model"}


def test_nodes_set_up_alike_raise_nothing():
    same = facts("a", NCCL_IB_DISABLE="0")
    rep = node_view({0: {"facts": same}, 1: {"facts": {**same, "hostname": "b"}}})
    assert rep.findings == []


def test_a_node_that_never_joined_is_named():
    rep = node_view({0: {"facts": facts("a"), "ranks": []}}, nnodes=3, rendezvous_failed=True)
    [f] = rep.findings
    assert f.code == "node-never-joined" and f.severity == "error"
    assert f.title.startswith("node 1, node 2 never joined") and "h:1" in f.title


def test_a_node_that_sent_nothing_after_the_run_is_lost():
    [f] = node_view({0: {"facts": facts("a"), "ranks": [0]}}).findings
    assert f.code == "node-lost" and "node 1 sent no report within 30 s" in f.title
    assert node_view({0: {"facts": facts("a")}}, gather_error="port taken").findings == []


# ------------------------------------------------------------------ node 0's job report
def steps(rank, n, *, lag=0.0, own=0.01, bwd_wait=0.0, t0=100.0):
    """A rank's step and arrival events: step s starts at t0 + s/10; backward at +own (+lag)."""
    out = []
    for s in range(1, n + 1):
        start = t0 + s / 10
        out.append({"kind": "step", "rank": rank, "step": s, "wall_s": own + lag + 0.005 + bwd_wait,
                    "backward_s": 0.005 + bwd_wait, "data_s": lag, "forward_s": own})
        out.append({"kind": "dist_step", "rank": rank, "step": s, "bwd_at": start + own + lag,
                    "coll_s": 0.0})
    out.append({"kind": "rank_result", "rank": rank, "outcome": "stopped", "exit_code": 0, "steps": n})
    return out


def summary(k, ranks, events, clock=0.0, host=None, **kw):
    return {"v": 1, "node_rank": k, "facts": facts(host or f"host{k}"), "ranks": ranks,
            "rendezvous": "ok", "result": {"outcome": "stopped"}, "rank_reports": {},
            "events": events, "clock": clock, **kw}


SPEC = NodeSpec(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29500")


def test_job_report_lists_the_nodes_and_names_the_slow_node():
    # node 1's host clock is 1000 s behind node 0's: its summary says so, the lags stay right
    n0 = summary(0, [1], steps(1, 12, bwd_wait=0.03))
    n1 = summary(1, [0], [{**e, "bwd_at": e["bwd_at"] - 1000} if "bwd_at" in e else e
                          for e in steps(0, 12, lag=0.03)], clock=1000.0)
    rep = job_report("dist", "train.py", SPEC, {}, {0: n0, 1: n1}, {"waited_s": 0.2}, 30.0)
    assert [n["node_rank"] for n in rep.metrics["nodes"]] == [0, 1]
    assert [n["ranks"] for n in rep.metrics["nodes"]] == [[1], [0]]
    [f] = [f for f in rep.findings if f.code == "rank-straggler"]
    assert f.title.startswith("rank 0 (node 1) is a straggler"), f.title
    assert f.evidence["nodes"] == {"rank 0": "node 1 (host1)"}
    assert {r["rank"]: r["node"] for r in rep.metrics["ranks"]["per_rank"]} == {0: 1, 1: 0}
    assert f.evidence["attributed_to"].startswith("node 1 (its only rank)")


@pytest.mark.parametrize("mate_lag,words", [(0.03, "node 1: all its 2 ranks"), (0.0, "rank 2 alone")])
def test_a_straggler_is_attributed_to_its_node_or_to_itself(mate_lag, words):
    n0 = summary(0, [0, 1], steps(0, 12) + steps(1, 12))
    n1 = summary(1, [2, 3], steps(2, 12, lag=0.04) + steps(3, 12, lag=mate_lag))
    rep = job_report("dist", "train.py", SPEC, {}, {0: n0, 1: n1}, {}, 30.0)
    [f] = [f for f in rep.findings if f.code == "rank-straggler"]
    assert f.evidence["attributed_to"].startswith(words), f.evidence


def test_job_report_of_a_healthy_pair_has_no_finding():
    n0, n1 = summary(0, [0], steps(0, 12)), summary(1, [1], steps(1, 12))
    rep = job_report("dist", "train.py", SPEC, {}, {0: n0, 1: n1}, {}, 30.0)
    assert rep.findings == [] and len(rep.metrics["nodes"]) == 2


def test_gathered_data_is_untrusted():
    """Garbage from another node is dropped, not trusted; its strings never reach the terminal raw."""
    evil = "\x1b[2J\x1b[1Aevil[/bold]"
    n1 = summary(1, [1, "x", -3], steps(1, 12) + ["junk", {"kind": "os.system", "rank": 1}, {"kind": "step"}],
                 host=evil, rank_reports={"1": {"findings": [
                     {"code": "script-crashed", "severity": "catastrophic", "title": evil},
                     "not a finding", {"code": 5}]}, "zz": 3})
    n1["facts"]["env"] = {"NCCL_ALGO": evil}
    n1["facts"]["torch"] = {"not": "a version"}
    n1.update(output_tail=5, result=[1], clock="soon", rendezvous={"x": 1})
    rep = job_report("dist", "train.py", SPEC, {}, {0: summary(0, [0], steps(0, 12)), 1: n1}, {}, 30.0)
    weird = job_report("dist", "train.py", SPEC, {}, {0: summary(0, [0], steps(0, 12)), 1: {
        "facts": [], "ranks": [1], "rank_reports": {"1": {"findings": {"a": 1}, "skipped": "x"}},
        "events": [{**e, "wall_s": "slow", "bwd_at": [1]} for e in steps(1, 12)], "output_tail": None}},
        {}, 30.0)
    assert [f.code for f in weird.findings if f.code == "internal-error"] == []
    mism = [f for f in rep.findings if f.code == "node-env-mismatch"]
    assert mism and "NCCL_ALGO" in mism[0].evidence["differences"]
    crashed = [f for f in rep.findings if f.code == "script-crashed"]
    assert crashed and crashed[0].severity == "error"  # the catalogue's severity, not the sender's
    assert rep.metrics["nodes"][1]["ranks"] == [1]
    from rich.console import Console

    from torchdoctor.report.console import render

    buf = io.StringIO()
    render(rep, Console(file=buf, force_terminal=True, width=160))
    text = buf.getvalue()
    assert "\x1b[2J" not in text and "\\x1b[2J" in text
    json.dumps(rep.to_dict())


def test_another_node_prints_its_own_section_and_where_the_job_report_is(tmp_path):
    spec = NodeSpec(nnodes=2, node_rank=1, rdzv_endpoint="node01:29500")
    own = summary(1, [], [])
    rep = node_section("dist", "train.py", spec, {}, {}, Evidence(), own, {"sent": True})
    assert rep.metrics["node"]["job_report"] == "printed by node 0 (node01)"
    assert rep.metrics["node"]["sent"] is True


# ------------------------------------------------------------------ self-test across nodes
NCCL_LOG = """\
node01:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
node01:1:1 [0] NCCL INFO Using network Socket
node01:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
node01:1:9 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0
"""


def test_nccl_transport_lines_are_read(tmp_path):
    from torchdoctor.distributed.selftest_nodes import transport_words, transports

    (tmp_path / "mlx5_0").mkdir()
    t = transports(NCCL_LOG, ib_dir=str(tmp_path))
    assert t == {"network": "Socket", "paths": {"P2P/CUMEM/read": 1, "NET/Socket/0": 1},
                 "ib_devices": ["mlx5_0"]}
    assert transport_words(t) == "P2P inside a node, TCP sockets between nodes"
    assert transports("", ib_dir=str(tmp_path / "none"))["network"] is None


def selftest_view(**st):
    from torchdoctor.distributed.evidence import SelftestEvidence

    rep = Report(command="dist")
    base = {"status": "ok", "backend": "nccl", "nnodes": 2, "world_size": 2, "ranks": [],
            "checks": [], "sweep": []}
    judge("dist-selftest", SelftestEvidence({**base, **st}, {}), rep)
    return [f for f in rep.findings if f.code == "inter-node-sockets"]


def test_sockets_between_nodes_with_an_ib_device_is_a_warning():
    [f] = selftest_view(transport={"network": "Socket", "paths": {}, "ib_devices": ["mlx5_0"]},
                        nodes={"inter_busbw_gbs": 1.2})
    assert f.severity == "warning" and "mlx5_0" in f.title and "1.2 GB/s" in f.title
    assert selftest_view(transport={"network": "IB", "paths": {}, "ib_devices": ["mlx5_0"]}) == []
    assert selftest_view(transport={"network": "Socket", "paths": {}, "ib_devices": []}) == []


def test_node_bandwidth_inside_and_between_nodes():
    from torchdoctor.distributed.selftest_nodes import node_bandwidth

    rows = [{"node_sweep": {"bytes": 1 << 30, "nodes": 2, "ranks_per_node": 2,
                            "intra_rep_s": [0.004, 0.004], "inter_rep_s": [0.05]}} for _ in range(4)]
    nb = node_bandwidth(rows)
    assert nb["intra_busbw_gbs"] == round((1 << 30) / 0.004 / 1e9, 3)  # 2 ranks: busbw = algbw
    assert nb["inter_busbw_gbs"] == round((1 << 30) / 0.05 / 1e9, 3)


def test_unfit_multi_node_options_exit_2_before_anything_starts(tmp_path, cli_inproc):
    run_cli = cli_inproc  # in-process; a run started would fail the test (conftest cli_inproc)
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    p = run_cli("checkup", "--nnodes", "2", "--rdzv-endpoint", "h:1", str(script))
    assert p.returncode == 2 and "--node-rank" in p.stderr and "never run" not in p.stdout + p.stderr
    p = run_cli("dist", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--max-restarts", "2")
    assert p.returncode == 2 and "--max-restarts must be 0" in p.stderr
    p = run_cli("checkup", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "host:²", str(script))
    assert p.returncode == 2 and "--rdzv-endpoint must be HOST:PORT, not 'host:²'" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "never run" not in p.stdout + p.stderr


def test_console_says_bandwidth_inside_and_between_nodes_and_the_transport():
    from torchdoctor.report.console import render_to_text

    rep = Report(command="dist")
    rep.metrics["dist"] = {"selftest": {"nnodes": 2, "node_rank": 0, "nodes": {
        "bytes": 1 << 30, "intra_busbw_gbs": 300.0, "inter_busbw_gbs": 2.5},
        "transport": {"network": "Socket", "paths": {"P2P/CUMEM": 4, "NET/Socket/0": 2}, "ib_devices": []}}}
    text = " ".join(render_to_text(rep, 200).split())
    assert "inside a node 300 GB/s bus bandwidth; between nodes 2.5 GB/s" in text
    assert "NCCL transport: P2P inside a node, TCP sockets between nodes." in text


# ------------------------------------------------------------------ the gather port itself
def test_node_summaries_travel_through_the_gather_port():
    """Node 1 sends before node 0's port is open (it retries); node 0 gets its bytes."""
    import socket
    import threading

    from torchdoctor.distributed import gather

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sent = {}
    t = threading.Thread(target=lambda: sent.update(gather.send("127.0.0.1", port, "j", 1, {"hello": "\x1b[2J"}, 20)))
    t.start()
    got, info = gather.collect(port, "j", 2, 20)
    t.join(30)
    assert sent == {"sent": True} and got == {1: b'{"hello":"\\u001b[2J"}'}
    assert info["waited_s"] < 20
    # a port already taken: said in the result, not raised
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        got, info = gather.collect(busy, "j", 2, 1)
    assert got == {} and "could not open the gather port" in info["error"]
