"""Multi-node attach on synthetic evidence (no process, no py-spy): a node's summary, node 0's
checks of it (a stranger's input), the merge into one job report, a node that never arrives.
The two-"node" run with real gloo jobs is in tests/test_attach_nodes_e2e.py (slow lane)."""

from __future__ import annotations

import json

import pytest

from test_attach_rules import code, collective, ev, proc
from torchdoctor.attach import nodecheck, nodes
from torchdoctor.distributed import gather
from torchdoctor.distributed.multinode import NodeSpec
from torchdoctor.errors import DoctorError

NODE = NodeSpec(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29999", rdzv_id="job1")


def node_ev(*procs, fr_state=None, world=None):
    e = ev(*procs, fr_state=fr_state)
    e["job"] = {"run_id": "r1", "world_size": world, "launcher_pid": 5}
    e["resources"] = {"interval_s": 1.0, "nvml": False, "nvml_reason": "no driver", "host_available": 1 << 30,
                      "series": [{"t": 100.0 + i, "procs": {str(p["pid"]): {"rss": (1 << 20) * (i + 1),
                                                                             "status": "sleeping", "cpu": 0.5,
                                                                             "gpu": []}
                                                            for p in procs}} for i in range(3)]}
    return e


def blob(e, k):
    return gather.encode(nodes.fit(nodes.summary(e, k)))


def test_a_nodes_summary_passes_node_0s_checks_unchanged():
    e = node_ev(proc(10, 2, [collective("all_reduce", 17)] * 5, wakes=1, cpu_ns=5),
                proc(12, 2, [code(9, "worker_loop")] * 5, role="worker", parent=10))
    e["processes"][0]["gil"] = {"rate_hz": 50, "seconds": 10, "threads": [
        {"tid": 10, "name": "MainThread", "samples": 3, "top": "train.py:17", "top_samples": 3}]}
    clean, reasons = nodecheck.parse(blob(e, 1), 1)
    assert reasons == []
    assert clean["processes"] == json.loads(json.dumps(e["processes"]))
    assert clean["resources"]["series"] == e["resources"]["series"]


def test_a_nodes_flight_recorder_read_passes_and_joins_the_job_report():
    """A real read's shape (flight.summarise of a torch dump, per process group too) is what a peer
    sends; node 0 keeps each rank's recorder with the rank's node and judges them together."""
    from torchdoctor.attach import flight

    def dump(done, pending):
        e = [{"collective_seq_id": s, "process_group": ["0", "default_pg"], "profiling_name": "nccl:all_reduce",
              "input_sizes": [[1024]], "output_sizes": [[1024]], "state": st}
             for s, st in [(i, "completed") for i in range(1, done + 1)] + [(p, "scheduled") for p in pending]]
        return {"file": "/tmp/x", **flight.summarise({"version": "2.10", "entries": e})}

    def read(r, d):
        return {"state": "read", "ranks": {str(r): d}}

    own = node_ev(proc(10, 0, [collective("all_reduce", 17)] * 5), fr_state=read(0, dump(5, [6])), world=2)
    peer = node_ev(proc(30, 1, [code(71)] * 5), fr_state=read(1, dump(5, [])), world=2)
    clean, reasons = nodecheck.parse(blob(peer, 1), 1)
    assert reasons == [] and clean["flight_recorder"] == json.loads(json.dumps(peer["flight_recorder"]))
    rep = nodes.job_report(own, {1: blob(peer, 1)}, {"port": 1}, NODE, "job", 1.0)
    f = next(f for f in rep.findings if f.code == "collective-hang")
    assert "seq 6" in f.title and "rank 1 (node 1) never called seq 6" in f.title, f.title
    assert set(rep.metrics["attach"]["flight_recorder"]["ranks"]) == {"0", "1"}


def test_the_job_report_groups_the_ranks_of_both_nodes_and_names_their_nodes():
    """Ranks 0, 1 on node 0 and 2, 3 on node 1 wait in all_reduce; rank 3 is stuck elsewhere:
    one collective-hang across the nodes, rank 3 named with its node. Same PIDs on both hosts
    (containers): node 1's are moved apart, their own PIDs kept."""
    own = node_ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [collective("all_reduce", 17)] * 5),
                  world=4)
    peer = node_ev(proc(10, 2, [collective("all_reduce", 17)] * 5), proc(11, 3, [code(71)] * 5), world=4)
    rep = nodes.job_report(own, {1: blob(peer, 1)}, {"port": 30000}, NODE, "job", 5.0)
    assert [f.code for f in rep.findings] == ["collective-hang"]
    f = rep.findings[0]
    assert "rank 3 (node 1)" in f.title and "ranks 0, 1, 2 wait in all_reduce" in f.title
    att = rep.metrics["attach"]
    rows = {r["rank"]: r for r in att["processes"]}
    assert rows[3]["node"] == 1 and rows[3]["host_pid"] == 11 and rows[3]["pid"] != 11
    assert rows[0]["node"] == 0 and "host_pid" not in rows[0]
    assert rows[3]["rss_samples"] == 3  # the peer's resource series follows its moved PID
    assert [n["ranks"] for n in att["nodes"]] == [[0, 1], [2, 3]]
    assert rep.metrics["job"]["reported"] == [0, 1]


def test_a_node_that_never_sends_is_named_with_the_ranks_it_holds():
    own = node_ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [collective("all_reduce", 17)] * 5),
                  world=4)
    rep = nodes.job_report(own, {}, {"port": 30000, "waited_s": 5.0}, NODE, "job", 5.0)
    lost = [f for f in rep.findings if f.code == "node-lost"]
    assert len(lost) == 1 and "node 1 sent no report within 5 s after node 0's sampling ended" in lost[0].title
    assert lost[0].evidence["their_ranks"] == [2, 3]
    assert rep.metrics["attach"]["nodes"][1] == {"node_rank": 1, "reported": False, "hostname": None, "ranks": []}


def test_a_hostile_summary_becomes_a_finding_never_a_crash():
    own = node_ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [collective("all_reduce", 17)] * 5))
    peer = nodes.summary(node_ev(proc(20, 2, [code(5)] * 5)), 1)
    peer["processes"][0]["samples"][0]["t"] = "soon"  # a sample the views cannot compute with
    peer["processes"][0]["rank"] = 1  # claims a rank node 0 holds: not taken from node 0
    peer["processes"].append({"pid": 21, "role": "rank", "rank": 7, "samples": [], "parent": 999})
    peer["flight_recorder"] = {"state": "read", "ranks": {"0": {"error": "x"}}}
    peer["extra"] = {"\x1b[31m": 1}
    rep = nodes.job_report(own, {1: gather.encode(peer)}, {"port": 1}, NODE, "job", 1.0)
    inv = [f for f in rep.findings if f.code == "node-summary-invalid"]
    assert len(inv) == 1
    reasons = " ".join(next(iter(inv[0].evidence["reasons"].values())))
    for what in ("samples[].t: not a finite number", "unknown field", "parent", "flight_recorder.ranks"):
        assert what in reasons, (what, reasons)
    rows = rep.metrics["attach"]["processes"]
    assert {r["rank"]: r["node"] for r in rows} == {0: 0, 1: 0}  # the claim on rank 1 was refused


@pytest.mark.parametrize("raw, why", [
    (b"[1, 2]", "not an object"),
    (b"{\"v\": 1, \"kind\": \"ranked\"}", "not an attach summary"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000, "nests deeper than"),
])
def test_a_summary_that_cannot_be_used_at_all_is_rejected_with_why(raw, why):
    clean, reasons = nodecheck.parse(raw, 1)
    assert clean is None and why in reasons[0]


def test_a_summary_sent_as_another_node_is_rejected():
    s = nodes.summary(node_ev(proc(20, 2, [code(5)] * 5)), 2)
    clean, reasons = nodecheck.parse(gather.encode(s), 1)
    assert clean is None and "sent as node 1" in reasons[0]


def test_a_large_summary_is_fitted_under_the_gather_bound_keeping_the_innermost_frames():
    deep = [code(5)[0]] * 500 + code(5)
    e = node_ev(*[proc(100 + i, i, [deep] * 5) for i in range(8)])
    s = nodes.fit(nodes.summary(e, 1), limit=400_000)
    assert len(gather.encode(s)) <= 400_000
    frames = s["processes"][0]["samples"][0]["threads"][0]["frames"]
    assert frames[0] == deep[0] and len(frames) < len(deep)


def test_the_node_options_need_nnodes_and_job():
    from torchdoctor.commands.attach import _node

    assert _node(None, None, None, None, True) is None
    with pytest.raises(DoctorError, match="need --nnodes"):
        _node(None, 1, None, None, True)
    with pytest.raises(DoctorError, match="needs --job"):
        _node(2, 0, "h:29500", None, False)
    with pytest.raises(DoctorError, match="HOST:PORT"):
        _node(2, 0, "nohost", None, True)
    spec = _node(2, 1, "127.0.0.1:29500", "abc", True)
    assert (spec.node_rank, spec.gather_port({}), spec.rdzv_id) == (1, 29501, "abc")
