"""``attach --job`` on every node of a multi-node job: one job report on node 0 (docs/attach.md).

Every node samples its own ranks (``session.collect``), then the same exchange as the multi-node
report of a launched run (:mod:`torchdoctor.distributed.gather`): node K > 0 sends its
:func:`summary` (the node's evidence, bounded) to node 0's gather port (rendezvous port + 1,
``TORCHDOCTOR_GATHER_PORT`` overrides it) and prints its own section; node 0 waits for them for
what is left of ``--timeout``, checks each under :mod:`torchdoctor.attach.nodecheck` (a summary is
input from a stranger), :func:`merge`\\ s every node's processes into one evidence and judges it
once: the attach rules see every rank of the job, the cross-node rules (probe ``nodes``) name a
node that sent nothing or something invalid.

PIDs are per host: a peer's process whose PID node 0 already holds (containers number alike) is
given ``pid + node * PID_SPAN`` in the merged evidence, its own PID kept as ``host_pid``.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from torchdoctor.attach.nodecheck import KIND, PID_MAX, VERSION
from torchdoctor.distributed import gather

PID_SPAN = PID_MAX
GATHER_AFTER = "node 0's sampling ended"
FRAMES_KEPT = 64  # frames per thread in a summary (innermost first); halved while it is too large


def summary(ev: dict[str, Any], node_rank: int) -> dict[str, Any]:
    """What node ``node_rank`` sends: its evidence, the fields nodecheck knows."""
    return {"v": VERSION, "kind": KIND, "node_rank": node_rank, "facts": {"hostname": socket.gethostname()},
            **{k: ev[k] for k in ("duration_s", "elapsed_s", "stack_samples", "sampler", "job",
                                  "processes", "resources", "flight_recorder") if k in ev}}


def _trim(s: dict[str, Any], frames: int, series_every: int) -> dict[str, Any]:
    procs = []
    for p in s.get("processes") or []:
        samples = [{**x, "threads": [{**t, "frames": t["frames"][:frames]} for t in x["threads"]]}
                   if "threads" in x else x for x in p.get("samples") or []]
        procs.append({**p, "samples": samples})
    res = dict(s.get("resources") or {})
    if series_every > 1:
        res["series"] = (res.get("series") or [])[::series_every]
    return {**s, "processes": procs, "resources": res}


def fit(s: dict[str, Any], limit: int = gather.MAX_BYTES) -> dict[str, Any]:
    """The summary within ``limit`` bytes of JSON: fewer frames per thread (the innermost kept,
    where a place is read), then every other resource snapshot, until it fits."""
    frames, every = FRAMES_KEPT, 1
    out = _trim(s, frames, every)
    while len(gather.encode(out)) > limit and (frames > 4 or every < 64):
        if frames > 4:
            frames //= 2
        else:
            every *= 2
        out = _trim(s, frames, every)
    return out


def merge(own: dict[str, Any], peers: dict[int, dict[str, Any]]) -> tuple[dict[str, Any], dict[int, int]]:
    """Node 0's evidence and the checked peers' → (one evidence, {rank: node})."""
    procs = [{**p, "node": 0} for p in own.get("processes") or []]
    taken = {p["pid"] for p in procs}
    node_of = {p["rank"]: 0 for p in procs if p.get("role") == "rank" and p.get("rank") is not None}
    series = list((own.get("resources") or {}).get("series") or [])
    nvml = bool((own.get("resources") or {}).get("nvml"))
    fr = dict(own.get("flight_recorder") or {})
    fr_ranks = dict(fr.get("ranks") or {})
    fr_states = {0: fr.get("state")}
    samples = [own.get("stack_samples") or 0]
    for k, s in sorted(peers.items()):
        mine = [p for p in s.get("processes") or []
                if not (p.get("role") == "rank" and p.get("rank") in node_of)]  # a rank is one node's
        clash = any(p["pid"] in taken for p in mine)
        shift = k * PID_SPAN if clash else 0
        for p in mine:
            q = {**p, "node": k, "pid": p["pid"] + shift}
            if shift:
                q["host_pid"] = p["pid"]
                if q.get("parent") is not None:
                    q["parent"] = q["parent"] + shift
            procs.append(q)
            taken.add(q["pid"])
            if q.get("role") == "rank" and q.get("rank") is not None:
                node_of[q["rank"]] = k
        keep = {str(p["pid"]) for p in mine}
        for snap in (s.get("resources") or {}).get("series") or []:
            series.append({"t": snap["t"], "node": k, "procs": {str(int(pid) + shift): v for pid, v
                                                                in snap["procs"].items() if pid in keep}})
        nvml = nvml or bool((s.get("resources") or {}).get("nvml"))
        pfr = s.get("flight_recorder") or {}
        fr_states[k] = pfr.get("state")
        fr_ranks.update({r: d for r, d in (pfr.get("ranks") or {}).items()
                         if r.isdigit() and node_of.get(int(r)) == k})
        samples.append(s.get("stack_samples") or 0)
    states = set(fr_states.values())
    if states == {"read"}:
        fr = {"state": "read", "ranks": fr_ranks}
    elif "not-enabled" in states:
        fr = {"state": "not-enabled", "how": fr.get("how") or next(
            (s.get("flight_recorder", {}).get("how") for s in peers.values()
             if s.get("flight_recorder", {}).get("how")), ""), "nodes": fr_states}
    else:
        fr = {**fr, "nodes": fr_states}
    res = dict(own.get("resources") or {})
    res.update(series=series, nvml=nvml)
    ev = {**own, "processes": procs, "resources": res, "flight_recorder": fr,
          "stack_samples": min(samples)}
    return ev, node_of


def collect_peers(node: Any, wait: float) -> tuple[dict[int, bytes], dict[str, Any]]:
    return gather.collect(node.gather_port(), node.rdzv_id, node.nnodes, wait)


def send(node: Any, ev: dict[str, Any], wait: float) -> dict[str, Any]:
    return gather.send(node.host, node.gather_port(), node.rdzv_id, node.node_rank,
                       fit(summary(ev, node.node_rank)), wait)


def job_report(own: dict[str, Any], blobs: dict[int, bytes], info: dict[str, Any], node: Any,
               label: str, wait: float):
    """Node 0: every node's processes judged as one job, and the nodes judged."""
    from torchdoctor.attach import nodecheck
    from torchdoctor.attach.report import build_report
    from torchdoctor.distributed.jobreport import _name_nodes
    from torchdoctor.evidence import Evidence
    from torchdoctor.findings import Report
    from torchdoctor.judge import judge

    peers: dict[int, dict[str, Any]] = {}
    bad: dict[int, list[str]] = {}
    rejected: set[int] = set()
    for k, blob in sorted(blobs.items()):
        clean, reasons = nodecheck.parse(bytes(blob), k)
        if clean is not None:
            peers[k] = clean
        else:
            rejected.add(k)
        if reasons:
            bad[k] = reasons
    for k, why in (info.get("refused") or {}).items():
        if isinstance(k, int) and k not in blobs:
            rejected.add(k)
            bad[k] = [str(why)]
    ev, node_of = merge(own, peers)
    report = build_report(ev, label)
    host0 = socket.gethostname()
    got = {0: {"facts": {"hostname": host0}}, **{k: {"facts": s.get("facts") or {}} for k, s in peers.items()},
           **{k: {"facts": {}} for k in rejected}}
    _name_nodes(report, node_of, got)
    world = (own.get("job") or {}).get("world_size")
    meta = {"nnodes": node.nnodes, "view_node": 0, "rdzv_endpoint": node.rdzv_endpoint,
            "rdzv_timeout": node.rdzv_timeout, "gather_wait_s": round(wait, 1),
            "gather_port": node.gather_port(), "rendezvous_failed": False, "gather_after": GATHER_AFTER}
    if isinstance(world, int) and world > 0:
        missing_ranks = sorted(set(range(world)) - set(node_of))
        if missing_ranks:
            meta["unreported_ranks"] = missing_ranks
    if info.get("error"):
        meta["gather_error"] = info["error"]
    evs = [{"kind": "node_summary", "node_rank": k, "facts": g["facts"],
            "ranks": sorted(r for r, n in node_of.items() if n == k), "rendezvous": "ok",
            "rejected": k in rejected, "invalid": bad.get(k) or []} for k, g in sorted(got.items())]
    view = Report(command="attach")
    judge("nodes", Evidence(meta=meta, events=evs), view)
    report.findings.extend(view.findings)
    report.skipped.extend(view.skipped)
    att = report.metrics["attach"]
    for row in att.get("processes") or []:
        p = next((q for q in ev["processes"] if q["pid"] == row["pid"]), {})
        row["node"] = p.get("node")
        if "host_pid" in p:
            row["host_pid"] = p["host_pid"]
    att["nodes"] = [{"node_rank": k, "reported": k in got and k not in rejected,
                     "hostname": (got.get(k) or {}).get("facts", {}).get("hostname"),
                     "ranks": sorted(r for r, n in node_of.items() if n == k)} for k in range(node.nnodes)]
    report.metrics["job"] = {"nnodes": node.nnodes, "reported": sorted(set(got) - rejected), "gather": info,
                             "rdzv_endpoint": node.rdzv_endpoint, "source": node.source}
    report.context["nodes"] = node.nnodes
    return report


def node_section(ev: dict[str, Any], node: Any, label: str, sent: dict[str, Any]):
    """Node K > 0: its own ranks, and where the job report is."""
    from torchdoctor.attach.report import build_report

    report = build_report(ev, label)
    report.metrics["node"] = {"node_rank": node.node_rank, "nnodes": node.nnodes,
                              "hostname": socket.gethostname(),
                              "job_report": f"printed by node 0 ({node.host})", "sent": bool(sent.get("sent")),
                              **({"send_error": sent["error"]} if sent.get("error") else {})}
    return report


def run(ev: dict[str, Any], node: Any, label: str, deadline: float):
    """After this node's sampling: exchange within what is left of --timeout (``deadline``,
    monotonic), then the report this node prints."""
    wait = max(1.0, deadline - time.monotonic())
    if node.node_rank == 0:
        blobs, info = collect_peers(node, wait)
        return job_report(ev, blobs, info, node, label, wait)
    return node_section(ev, node, label, send(node, ev, wait))
