"""The transport rule of a multi-node self-test (probe ``dist-selftest``): inter-node-sockets,
NCCL carrying the traffic between nodes over TCP sockets although the host has InfiniBand/RoCE
devices. Judged on the self-test's ``transport`` (torchdoctor/distributed/selftest_nodes.py:
NCCL's own ``Using network ...`` / ``via NET/...`` lines and ``/sys/class/infiniband``).
"""

from __future__ import annotations

from torchdoctor.catalog import declare
from torchdoctor.distributed.evidence import SelftestEvidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import DISTRIBUTED

INTER_NODE_SOCKETS = declare("inter-node-sockets", DISTRIBUTED, "warning",
                             "NCCL uses TCP sockets between nodes although an InfiniBand/RoCE device is present")


@rule("inter-node-sockets", probes={"dist-selftest"}, needs={"selftest"}, raises=[INTER_NODE_SOCKETS])
def inter_node_sockets(ev: SelftestEvidence) -> list[Finding]:
    st = ev.selftest
    if int(st.get("nnodes") or 1) < 2:
        return []  # one node: no traffic between nodes (not listed as "not judged" either)
    t = st.get("transport") or {}
    if st.get("backend") != "nccl" or not (t.get("network") or t.get("paths")):
        raise NotApplicable("no NCCL transport lines (gloo, or NCCL_DEBUG set by the user)")
    net = t.get("network")
    socket = net == "Socket" or any(str(p).startswith("NET/Socket") for p in t.get("paths") or {})
    if not socket or not t.get("ib_devices"):
        return []
    nodes = st.get("nodes") or {}
    bw = nodes.get("inter_busbw_gbs")
    return [finding(
        "inter-node-sockets",
        f"NCCL sends the traffic between nodes over TCP sockets although this node has "
        f"InfiniBand/RoCE devices ({', '.join(map(str, t['ib_devices'][:4]))})"
        + (f"; inter-node all-reduce bus bandwidth {bw:g} GB/s" if isinstance(bw, (int, float)) else ""),
        {"network": net, "paths": t.get("paths"), "ib_devices": t.get("ib_devices"),
         "inter_node_busbw_gbs": bw},
        fix="Check that NCCL can use the IB devices: NCCL_IB_DISABLE unset or 0, NCCL_IB_HCA "
            "naming the right devices, NCCL_NET not forcing Socket, the RDMA libraries "
            "(libibverbs, rdma-core) and the IB driver in the container, and "
            "NCCL_SOCKET_IFNAME only used for bootstrap; run with NCCL_DEBUG=INFO and look for "
            "'NET/IB' in the 'Using network' line")]
