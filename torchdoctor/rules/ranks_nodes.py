"""Cross-node rules of a multi-node job (probe ``"nodes"``): node-env-mismatch,
node-never-joined, node-lost, node-summary-invalid.

They judge the node view built by :mod:`torchdoctor.distributed.jobreport`: one ``node_summary``
event per node that reported {node_rank, hostname, facts, ranks, rendezvous, invalid: the
reasons its summary failed node 0's checks (:mod:`torchdoctor.distributed.peer`), rejected:
nothing of it could be used}, and ``meta``
{nnodes, view_node, rdzv_endpoint, rdzv_timeout, gather_wait_s, gather_error?,
rendezvous_failed}. Node 0's view holds every node that reported; another node's view holds
itself only (it judges a rendezvous that never completed, nothing else).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.distributed import gather, peer
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import DISTRIBUTED

FACTS = (("torch", "torch version"), ("cuda", "CUDA version of torch"), ("nccl", "NCCL version"),
         ("driver", "NVIDIA driver"), ("gpu", "GPU model"))
UNSET = "(unset)"

NODE_ENV_MISMATCH = declare("node-env-mismatch", DISTRIBUTED, "warning",
                            "the nodes of a job differ in versions, GPU model or NCCL_*/TORCH_* variables")
NODE_NEVER_JOINED = declare("node-never-joined", DISTRIBUTED, "error",
                            "a node never joined the job's rendezvous")
NODE_LOST = declare("node-lost", DISTRIBUTED, "error",
                    "a node of the job sent no report: it died, hung or lost its network")
NODE_SUMMARY_INVALID = declare(
    "node-summary-invalid", DISTRIBUTED, "error",
    "a node's summary failed node 0's checks; what failed is left out of the job report",
    thresholds={"MAX_BYTES": peer.MAX_BYTES, "MAX_TOTAL_BYTES": gather.MAX_TOTAL_BYTES,
                "MAX_ITEMS": peer.MAX_ITEMS, "MAX_DEPTH": peer.MAX_DEPTH, "MAX_EVENTS": peer.MAX_EVENTS,
                "MAX_FINDINGS": peer.MAX_FINDINGS, "HEADER_BYTES": gather.HEADER_BYTES,
                "MAX_CONNECTIONS": gather.MAX_CONNECTIONS})


def nodes(ev: Evidence) -> dict[int, dict[str, Any]]:
    return {int(e["node_rank"]): e for e in ev.of("node_summary")}


def nname(k: int, summary: dict[str, Any] | None = None) -> str:
    host = ((summary or {}).get("facts") or {}).get("hostname")
    return f"node {k} ({host})" if host else f"node {k}"


def _values(by: dict[int, dict[str, Any]]) -> dict[str, dict[int, str]]:
    """{what: {node: value}} for every fact and variable that is not the same on all nodes."""
    out: dict[str, dict[int, str]] = {}
    for key, label in FACTS:
        vals = {k: (s.get("facts") or {}).get(key) for k, s in by.items()}
        known = {k: str(v) for k, v in vals.items() if v is not None}
        if len(set(known.values())) > 1:
            out[label] = {k: known.get(k, "(unknown)") for k in vals}
    names = sorted({n for s in by.values() for n in ((s.get("facts") or {}).get("env") or {})})
    for n in names:
        vals = {k: str(((s.get("facts") or {}).get("env") or {}).get(n, UNSET)) for k, s in by.items()}
        if len(set(vals.values())) > 1:
            out[n] = vals
    return out


def _words(what: str, vals: dict[int, str]) -> str:
    groups: dict[str, list[int]] = {}
    for k, v in sorted(vals.items()):
        groups.setdefault(v, []).append(k)
    parts = [f"{v if v in (UNSET, '(unknown)') else repr(v)} on node{'s' if len(ks) > 1 else ''} "
             f"{', '.join(map(str, ks))}" for v, ks in groups.items()]
    return f"{what} is {' but '.join(parts)}"


@rule("node-env-mismatch", probes={"nodes"}, needs={"node_summary"}, raises=[NODE_ENV_MISMATCH])
def node_env_mismatch(ev: Evidence) -> list[Finding]:
    by = {k: s for k, s in nodes(ev).items() if not s.get("rejected")}  # a rejected one has no facts
    if len(by) < 2:
        raise NotApplicable("fewer than two nodes reported")
    diff = _values(by)
    if not diff:
        return []
    first = next(iter(diff))
    more = f" (and {len(diff) - 1} more difference{'s' if len(diff) > 2 else ''})" if len(diff) > 1 else ""
    return [finding(
        "node-env-mismatch", f"the nodes are not set up alike: {_words(first, diff[first])}{more}",
        {"differences": {w: {nname(k, by.get(k)): v for k, v in vals.items()}
                         for w, vals in list(diff.items())[:20]}},
        fix="Give every node the same software and settings: the same torch/CUDA/NCCL build and "
            "driver, the same GPU model for one job, and the same NCCL_*/TORCH_* variables (set "
            "them in the job script or the launcher's environment, not per host); a difference "
            "in NCCL settings between nodes can pick different protocols and hang or slow down "
            "collectives")]


def _missing(ev: Evidence) -> tuple[int, dict, list[int]]:
    """(nodes in the job, the nodes that reported by node rank, the node ranks that did not)."""
    n = int(ev.meta.get("nnodes") or 0)
    by = nodes(ev)
    return n, by, [k for k in range(n) if k not in by]


@rule("node-never-joined", probes={"nodes"}, needs={"node_summary"}, raises=[NODE_NEVER_JOINED])
def node_never_joined(ev: Evidence) -> list[Finding]:
    if not ev.meta.get("rendezvous_failed"):
        return []  # the rendezvous completed: every node joined
    n, by, missing = _missing(ev)
    if not missing:
        return []
    names = ", ".join(f"node {k}" for k in missing)
    ep, t = ev.meta.get("rdzv_endpoint"), ev.meta.get("rdzv_timeout")
    return [finding(
        "node-never-joined",
        f"{names} never joined: the rendezvous at {ep} timed out after {t:g} s with "
        f"{len(by)} of {n} nodes' torchdoctor present ({', '.join(nname(k, s) for k, s in sorted(by.items()))})",
        {"missing_nodes": missing, "rdzv_endpoint": ep, "rdzv_timeout_s": t,
         "present": [nname(k, s) for k, s in sorted(by.items())],
         "torchrun": ev.meta.get("rendezvous_error")},
        fix="Start torchdoctor (or srun) on every node with the same --nnodes, --rdzv-endpoint "
            "and --rdzv-id, and a distinct --node-rank; check that the missing node can reach "
            f"{ep} (firewall, hostname) and that it started at all (its own output); raise "
            "--rdzv-timeout if nodes start far apart")]


@rule("node-lost", probes={"nodes"}, needs={"node_summary"}, raises=[NODE_LOST])
def node_lost(ev: Evidence) -> list[Finding]:
    if ev.meta.get("rendezvous_failed"):
        raise NotApplicable("the rendezvous did not complete")
    if ev.meta.get("view_node") != 0:
        raise NotApplicable("judged on node 0, which gathers the job")
    if ev.meta.get("gather_error"):
        raise NotApplicable(f"the gather port did not open: {ev.meta['gather_error']}")
    n, by, missing = _missing(ev)
    if not missing:
        return []
    names = ", ".join(f"node {k}" for k in missing)
    wait = ev.meta.get("gather_wait_s")
    after = ev.meta.get("gather_after") or "node 0's ranks ended"  # attach: its sampling ended
    evidence: dict[str, Any] = {"missing_nodes": missing, "waited_s": wait,
                                "gather_port": ev.meta.get("gather_port")}
    if ev.meta.get("unreported_ranks"):
        evidence["their_ranks"] = ev.meta["unreported_ranks"]
    if ev.meta.get("rank_outcomes"):
        evidence["ranks_that_reported"] = ev.meta["rank_outcomes"]
    return [finding(
        "node-lost", f"{names} sent no report within {wait:g} s after "
                     f"{after}: "
                     f"it died, hung, or cannot reach node 0's port {ev.meta.get('gather_port')}",
        evidence,
        fix="Look at that node's own output (its torchdoctor prints its section there) and its "
            "system log (out-of-memory killer, hardware errors, a reboot); if it ran but could not "
            "report, open the port to node 0 or set TORCHDOCTOR_GATHER_PORT on every node")]


@rule("node-summary-invalid", probes={"nodes"}, needs={"node_summary"}, raises=[NODE_SUMMARY_INVALID])
def node_summary_invalid(ev: Evidence) -> list[Finding]:
    by = nodes(ev)
    bad = {k: s for k, s in sorted(by.items()) if s.get("invalid")}
    if not bad:
        return []
    first = next(iter(bad.values()))
    words = ", ".join(nname(k, s) + (" (nothing of it used)" if s.get("rejected") else "") for k, s in bad.items())
    more = sum(len(s["invalid"]) for s in bad.values()) - 1
    port = ev.meta.get("gather_port")
    evidence: dict[str, Any] = {"reasons": {nname(k, s): list(s["invalid"]) for k, s in bad.items()}}
    left_out = [nname(k, s) for k, s in bad.items() if s.get("rejected")]
    if left_out:  # nothing of these was used: their ranks are missing from the report
        evidence["left_out"] = left_out
    evidence["gather_port"] = port
    return [finding(
        "node-summary-invalid",
        f"the summary from {words} failed node 0's checks: {first['invalid'][0]}"
        + (f" (and {more} more)" if more > 0 else "") + "; what failed is left out of this report",
        evidence,
        fix="Run the same torchdoctor version on every node (a newer one may send codes or fields "
            "this one does not know). If every node runs the same version, something other than "
            f"this job's torchdoctor wrote to node 0's gather port {port}: let only the job's nodes "
            "reach it (a firewall rule), or set TORCHDOCTOR_GATHER_PORT on every node to a port "
            "only this job uses; then run the job again for a complete report")]
