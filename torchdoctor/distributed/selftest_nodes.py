"""The self-test across nodes (``dist --nnodes N ...`` without a script).

Worker side (:func:`node_sweep`, :func:`share_records`, in every rank after the job-wide sweep):
the all-reduce bus bandwidth inside each node (the ranks of one node: NVLink/PCIe/shared memory)
and between nodes (one rank per node, same local rank: the network), timed like the main sweep
on one size; then every rank's record is all-gathered so that every node's agent holds the
whole job (each node's local rank 0 writes ``job.json``), no shared filesystem needed.

Parent side (:func:`transports`): which transport NCCL chose, from its own ``NCCL_DEBUG=INFO``
lines in the launch log (``NET/IB``, ``NET/Socket``, ``P2P``, ``SHM``; set for the self-test
only when the user has not set ``NCCL_DEBUG``), and whether the host has InfiniBand/RoCE
devices (``/sys/class/infiniband``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from torchdoctor.distributed.timing import time_all_reduce

JOB_FILE = "job.json"
NET_LINE = re.compile(r"NCCL INFO .*Using network (\w+)")
VIA = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] (?:\[\w+\] )?via (\S+)")
IB_SYS = "/sys/class/infiniband"


class _Group:
    """``dist`` seen through one process group (what time_all_reduce calls)."""

    def __init__(self, dist, group):
        self.dist, self.group = dist, group

    def all_reduce(self, x):
        self.dist.all_reduce(x, group=self.group)

    def barrier(self):
        self.dist.barrier(group=self.group)


def node_sweep(dist, torch, rec, device, nbytes: int, warmup: int, reps: int, iters: int) -> None:
    """Intra- and inter-node all-reduce of ``nbytes`` (every rank calls this: new_group is
    collective). Writes ``node_sweep`` into the rank's record."""
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    if local < 1 or world % local:
        rec.update(node_sweep={"error": f"uneven nodes: world {world}, {local} ranks per node"})
        return
    nodes = world // local
    intra = [dist.new_group([g * local + l for l in range(local)]) for g in range(nodes)] if local > 1 else []
    inter = [dist.new_group([g * local + l for g in range(nodes)]) for l in range(local)] if nodes > 1 else []
    g, l = divmod(rank, local)
    x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    out: dict[str, Any] = {"bytes": nbytes, "iters": iters, "node": g, "ranks_per_node": local,
                           "nodes": nodes}
    rec.update(phase="sweep:intra-node")
    if intra:
        out["intra_rep_s"] = time_all_reduce(_Group(dist, intra[g]), torch, x, iters, warmup, reps)
    rec.update(phase="sweep:inter-node")
    if inter:
        out["inter_rep_s"] = time_all_reduce(_Group(dist, inter[l]), torch, x, iters, warmup, reps)
    rec.update(node_sweep=out)


def share_records(dist, rec, out_dir: Path) -> None:
    """All-gather every rank's record; local rank 0 of each node writes them to ``job.json``."""
    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, rec.data)
    if int(os.environ.get("LOCAL_RANK") or 0) == 0:
        tmp = out_dir / (JOB_FILE + ".tmp")
        tmp.write_text(json.dumps([r for r in records if isinstance(r, dict)], indent=1))
        tmp.replace(out_dir / JOB_FILE)


def read_job(out_dir: Path) -> list[dict] | None:
    try:
        data = json.loads((out_dir / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else None


def node_bandwidth(ranks: list[dict]) -> dict[str, Any] | None:
    """{bytes, intra_busbw_gbs, inter_busbw_gbs, nodes, ranks_per_node} from the ranks' records
    (mean over ranks of each rank's median repetition, as the main sweep)."""
    from torchdoctor.distributed.busbw import allreduce_bandwidth, median

    rows = [r.get("node_sweep") for r in ranks if isinstance(r.get("node_sweep"), dict)]
    rows = [r for r in rows if "bytes" in r]
    if not rows:
        return None
    first = rows[0]
    out: dict[str, Any] = {"bytes": first["bytes"], "nodes": first.get("nodes"),
                           "ranks_per_node": first.get("ranks_per_node")}
    for key, n in (("intra", first.get("ranks_per_node")), ("inter", first.get("nodes"))):
        times = [median(r[f"{key}_rep_s"]) for r in rows if r.get(f"{key}_rep_s")]
        if times and n and n > 1:
            t = sum(times) / len(times)
            _, busbw = allreduce_bandwidth(first["bytes"], t, n)
            out[f"{key}_busbw_gbs"] = round(busbw, 3)
            out[f"{key}_time_us"] = round(t * 1e6, 2)
    return out


def transports(log_text: str, ib_dir: str = IB_SYS) -> dict[str, Any]:
    """What NCCL said it uses: {network: 'IB'|'Socket'|None, paths: {'P2P/CUMEM': n, 'NET/IB/0': n, ...},
    ib_devices: [...]} (empty without NCCL_DEBUG=INFO lines)."""
    nets = {m.group(1) for m in NET_LINE.finditer(log_text)}
    paths: dict[str, int] = {}
    for m in VIA.finditer(log_text):
        paths[m.group(1)] = paths.get(m.group(1), 0) + 1
    try:
        ib = sorted(p.name for p in Path(ib_dir).iterdir())
    except OSError:
        ib = []
    return {"network": sorted(nets)[0] if len(nets) == 1 else (sorted(nets) or None),
            "paths": paths, "ib_devices": ib}


def transport_words(t: dict[str, Any]) -> str | None:
    """'NVLink/P2P inside a node, InfiniBand between nodes' from :func:`transports`."""
    paths = t.get("paths") or {}
    inside = [p for p in paths if p.startswith(("P2P", "SHM"))]
    between = [p for p in paths if p.startswith("NET")]
    net = t.get("network")
    bits = []
    if inside:
        bits.append(f"{'/'.join(sorted({p.split('/')[0] for p in inside}))} inside a node")
    if between or net:
        kind = {"IB": "InfiniBand/RoCE", "Socket": "TCP sockets"}.get(str(net), str(net))
        bits.append(f"{kind} between nodes")
    return ", ".join(bits) or None
