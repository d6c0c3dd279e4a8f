"""One report for a multi-node job: each node judges its own ranks, node 0 gathers and merges.

Flow on every node (after its torchrun ended): the node's rank dirs (by local rank, labelled
with their global ranks) → each rank judged as a single run (``ranked.judge_ranks``) → the
node's summary (:func:`node_summary`: its facts, each rank's findings, the evidence the
cross-rank rules read, its outcome) → node 0 collects the summaries through its gather port
(:mod:`torchdoctor.distributed.gather`) and prints the job report (:func:`job_report`:
findings merged across every rank, cross-rank rules on every rank, cross-node rules of probe
``"nodes"``, the ``nodes`` list); every other node sends its summary and prints its own section,
which says where the job report is.

Clocks: the per-step arrival times are each host's ``time.monotonic()``; each summary carries
``time.time() - time.monotonic()`` of its host, and node 0 moves every node's times onto its
own clock by the difference, so across hosts the arrival lags are as good as the hosts' NTP
sync (the same host: exact). On CUDA the straggler rule uses device times, which need no clock.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from torchdoctor.distributed.peer import NUMERIC, SHIPPED  # what a summary may carry
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, Report, Skipped

GATHER_WAIT_S = 30.0  # node 0 waits this long for the other nodes' summaries after its run
RDZV_FAILED_WAIT_S = 3.0  # ... and only this long when its rendezvous never completed
KIND_CAP = 2000  # events of one kind per rank shipped (the most recent)
COLLECTIVE_CAP = 400
CLOCK_FIELDS = {"dist_step": ("bwd_at", "end_at"), "collective": ("t",)}
RDZV_ERRORS = ("RendezvousTimeoutError", "RendezvousClosedError", "RendezvousConnectionError",
               "RendezvousError", "DistStoreError")


# ---------------------------------------------------------------- every node
def preload() -> None:
    """Import torch (the node's facts read its build) in a thread while the ranks run (≈ 2 s)."""
    import threading

    def _imp() -> None:
        try:
            import torch  # noqa: F401
        except Exception:  # noqa: BLE001 - nodefacts reports it when it needs torch
            pass

    threading.Thread(target=_imp, name="torchdoctor-preload", daemon=True).start()


def run_node(probe: str, target: str, run_dir: Path, nproc: int, node: Any) -> Report:
    from torchdoctor.distributed import gather
    from torchdoctor.evidence.ranks import merged_evidence, rank_labels
    from torchdoctor.distributed.ranked import judge_ranks

    per, merged = merged_evidence(run_dir, nproc, rank_labels(run_dir, nproc))
    reports = judge_ranks(probe, per)
    own = node_summary(node, per, reports, merged)
    wait = RDZV_FAILED_WAIT_S if own["rendezvous"] == "failed" else gather_wait()
    if node.node_rank == 0:
        blobs, info = gather.collect(node.gather_port(), node.rdzv_id, node.nnodes, wait)
        report = job_report(probe, target, node, per, {0: own, **blobs}, info, wait)
        if merged.result.get("flight_recorder"):  # what node 0's launch added (every node alike)
            report.metrics.setdefault("run", {})["flight_recorder"] = merged.result["flight_recorder"]
        return report
    own = fit(own, gather.MAX_BYTES)
    sent = gather.send(node.host, node.gather_port(), node.rdzv_id, node.node_rank, own, wait)
    return node_section(probe, target, node, per, reports, merged, own, sent)


def gather_wait() -> float:
    """GATHER_WAIT_S, or ``TORCHDOCTOR_GATHER_WAIT_S`` (seconds > 0) when set."""
    import os

    try:
        v = float(os.environ.get("TORCHDOCTOR_GATHER_WAIT_S") or GATHER_WAIT_S)
    except ValueError:
        v = GATHER_WAIT_S
    return v if v > 0 else GATHER_WAIT_S


def rendezvous_error(merged: Evidence) -> str | None:
    for ln in merged.result.get("output_tail") or []:
        if any(e in ln for e in RDZV_ERRORS):
            return ln.strip()[:300]
    return None


def node_summary(node: Any, per: dict[int, Evidence], reports: dict[int, Report],
                 merged: Evidence) -> dict[str, Any]:
    """What this node sends to node 0 (JSON; see the module docstring)."""
    from torchdoctor.distributed import nodefacts
    from torchdoctor.pipeline.judging import context_of

    gpus = [e.get("name") for ev in per.values() for e in ev.of("device")
            if str(e.get("device", "")).startswith("cuda") and e.get("name")]
    kept = recent(merged.events, KIND_CAP)
    res = merged.result
    started = bool(per)
    err = None if started else rendezvous_error(merged)
    first = per[min(per)] if per else Evidence()
    world = next((ev.options.get("world_size") for ev in per.values() if ev.options.get("world_size")), None)
    return {
        "v": 1, "node_rank": node.node_rank, "nproc": len(per) if per else None,
        "facts": nodefacts.collect(gpu_names=gpus), "ranks": sorted(per), "world_size": world,
        "rendezvous": "ok" if started else ("failed" if err or res.get("launcher_returncode") else "unknown"),
        "rendezvous_error": err,
        "result": {k: res.get(k) for k in ("outcome", "exit_code", "failed_rank", "wall_s",
                                           "launcher_returncode", "timeout_s") if res.get(k) is not None},
        "output_tail": list(res.get("output_tail") or [])[-40:],
        "rank_reports": {str(r): {"findings": [f.to_dict() for f in rep.findings],
                                  "skipped": [s.to_dict() for s in rep.skipped]}
                         for r, rep in reports.items()},
        "events": kept, "clock": time.time() - time.monotonic(), "context": context_of(first),
    }


def recent(events: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """The shipped events, at most ``cap`` of a kind per rank (collectives: a fifth of it, at
    most COLLECTIVE_CAP), the most recent, in their order."""
    kept: list[dict[str, Any]] = []
    counts: dict[tuple[int, str], int] = {}
    for e in reversed(events):
        k = e.get("kind")
        if k not in SHIPPED:
            continue
        key = (int(e.get("rank", -1)), k)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] <= (min(COLLECTIVE_CAP, cap // 5) if k == "collective" else cap):
            kept.append(e)
    kept.reverse()
    return kept


def fit(summary: dict[str, Any], limit: int) -> dict[str, Any]:
    """The summary within ``limit`` bytes of JSON (what node 0 reads of one node): while it is
    larger, keep half as many events of a kind per rank (the most recent; ``events_cap`` says
    how many), down to none. A long GPU run on a node of 8 ranks ships 8.26 MB at KIND_CAP."""
    from torchdoctor.distributed.gather import encode

    cap = KIND_CAP
    while len(encode(summary)) > limit and summary["events"]:
        cap //= 2
        summary = {**summary, "events": recent(summary["events"], cap) if cap >= 10 else [],
                   "events_cap": cap if cap >= 10 else 0}
    return summary


def node_section(probe: str, target: str, node: Any, per: dict[int, Evidence],
                 reports: dict[int, Report], merged: Evidence, own: dict[str, Any],
                 sent: dict[str, Any]) -> Report:
    """Node K > 0: its own ranks (their own findings; cross-rank ones are in the job report)."""
    from torchdoctor.distributed.ranked import assemble

    rep = assemble(probe, target, per, reports, merged, len(per), cross_rank=False, ranks=sorted(per))
    rep.metrics["node"] = {
        "node_rank": node.node_rank, "nnodes": node.nnodes, "hostname": own["facts"].get("hostname"),
        "ranks": own["ranks"], "job_report": f"printed by node 0 ({node.host})",
        "sent": bool(sent.get("sent")), **({"send_error": sent["error"]} if sent.get("error") else {})}
    if own["rendezvous"] == "failed":  # nobody else came: judged here, with what this node knows
        _judge_nodes(rep, {node.node_rank: own}, node, {}, wait=0.0)
    return rep


# ---------------------------------------------------------------- node 0
def _rank_reports(probe: str, s: dict[str, Any], ranks: set[int]) -> dict[int, Report]:
    """The per-rank findings of a summary checked by :mod:`~torchdoctor.distributed.peer`."""
    out: dict[int, Report] = {}
    for key, rep in (s.get("rank_reports") or {}).items():
        if int(key) not in ranks:
            continue
        r = Report(command=probe)
        r.findings = [Finding(f["code"], f["skill"], f["severity"], f["title"], f["evidence"], f["fix"],
                              f["docs"]) for f in rep["findings"]]
        r.skipped = [Skipped(x["rule"], x["reason"]) for x in rep["skipped"]]
        out[int(key)] = r
    return out


def _ranks_of(s: dict[str, Any], taken: set[int]) -> list[int]:
    rs = s.get("ranks") if isinstance(s.get("ranks"), list) else []
    return sorted({r for r in rs if isinstance(r, int) and 0 <= r < 1_000_000 and r not in taken})


def _numbers_ok(e: dict[str, Any]) -> bool:
    from torchdoctor.distributed.peer import number

    return all(e.get(k) is None or number(e[k]) for k in NUMERIC)


def checked(got: dict[int, Any], info: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], dict[int, list[str]]]:
    """Node 0's own summary as it is, every other node's through :mod:`~torchdoctor.distributed.peer`
    (bytes from the port are parsed, dicts checked): ({node: summary}, {node: reasons}).

    A node whose summary could not be used at all (or whose claim the port refused) keeps a
    place with no ranks and ``rejected``: it did report, so it is not lost; it is not compared."""
    from torchdoctor.distributed import peer

    out: dict[int, dict[str, Any]] = {0: got[0]}
    bad: dict[int, list[str]] = {}
    for k, s in sorted(got.items()):
        if k == 0:
            continue
        clean, reasons = peer.parse(bytes(s), k) if isinstance(s, (bytes, bytearray)) else peer.check(s, k)
        out[k] = clean if clean is not None else _rejected(k)
        if reasons:
            bad[k] = reasons
    for k, why in (info.get("refused") or {}).items():
        if isinstance(k, int) and k not in out:
            out[k], bad[k] = _rejected(k), [str(why)]
    for key, when in (("claimed_again", "after its summary arrived"),
                      ("claimed_while_arriving", "while its summary was arriving")):
        for k, n in (info.get(key) or {}).items():
            if isinstance(k, int) and k in out:
                bad.setdefault(k, []).append(
                    f"{n} more sender{'s' if n > 1 else ''} claimed to be node {k} {when}")
    return out, bad


def _rejected(k: int) -> dict[str, Any]:
    return {"v": 1, "node_rank": k, "ranks": [], "facts": {"env": {}}, "rendezvous": "unknown",
            "result": {}, "output_tail": [], "rank_reports": {}, "events": [], "rejected": True}


def job_report(probe: str, target: str, node: Any, per: dict[int, Evidence],
               got: dict[int, dict[str, Any]], info: dict[str, Any], wait: float) -> Report:
    from torchdoctor.distributed.ranked import assemble
    from torchdoctor.distributed.torchrun import merged_outcome

    got, bad = checked(got, info)  # node 0's own is ours; every other node's is untrusted
    c0 = got[0].get("clock")
    clock0 = float(c0) if isinstance(c0, (int, float)) else 0.0
    events: list[dict[str, Any]] = []
    rank_reports: dict[int, Report] = {}
    node_of: dict[int, int] = {}
    for k, s in sorted(got.items()):
        ranks = _ranks_of(s, set(node_of))
        node_of.update({r: k for r in ranks})
        rank_reports.update(_rank_reports(probe, s, set(ranks)))
        shift = float(s.get("clock") or 0.0) - clock0 if isinstance(s.get("clock"), (int, float)) else 0.0
        for e in s.get("events") or []:
            if not (isinstance(e, dict) and e.get("kind") in SHIPPED and e.get("rank") in ranks
                    and _numbers_ok(e)):
                continue
            for f in CLOCK_FIELDS.get(e["kind"], ()):
                if isinstance(e.get(f), (int, float)):
                    e = {**e, f: e[f] + shift}
            events.append(e)
    results = [e for e in events if e["kind"] == "rank_result"]
    timed_out = any((s.get("result") or {}).get("outcome") == "timeout" for s in got.values()
                    if isinstance(s.get("result"), dict))
    tails = [ln for k, s in sorted(got.items()) for ln in (s.get("output_tail") or [])[-40:]
             if isinstance(ln, str)]
    job_result = {"output_tail": tails, **merged_outcome(results, timed_out),
                  "ranks": [{k: v for k, v in e.items() if k in ("rank", "outcome", "exit_code", "signal",
                                                                    "steps", "stopped_by_launcher")}
                            for e in sorted(results, key=lambda e: e["rank"])],
                  "steps": min((int(e.get("steps") or 0) for e in results), default=0)}
    if not results:  # no rank started anywhere (a rendezvous that never completed)
        job_result.update(outcome="not_started", exit_code=None)
    world = len(node_of)
    merged = Evidence(meta={"probe": probe, "world_size": world, "options": {}}, events=events,
                      result=job_result)
    report = assemble(probe, target, per, rank_reports, merged, world, ranks=sorted(node_of),
                      cross_rank=bool(node_of))
    _judge_nodes(report, got, node, info, wait, merged, bad)
    _name_nodes(report, node_of, got)
    _attribute_straggler(report, node_of)
    report.metrics["nodes"] = _nodes_metric(got, node_of, report, node.nnodes)
    report.metrics["job"] = {"nnodes": node.nnodes, "reported": sorted(got), "gather": info,
                             "rdzv_endpoint": node.rdzv_endpoint, "source": node.source}
    report.context["nodes"] = node.nnodes
    return report


def _judge_nodes(report: Report, got: dict[int, dict[str, Any]], node: Any, info: dict[str, Any],
                 wait: float, merged: Evidence | None = None, bad: dict[int, list[str]] | None = None) -> None:
    from torchdoctor.judge import judge as apply_rules

    failed = any(s.get("rendezvous") == "failed" for s in got.values())
    meta = {"nnodes": node.nnodes, "view_node": node.node_rank, "rdzv_endpoint": node.rdzv_endpoint,
            "rdzv_timeout": node.rdzv_timeout, "gather_wait_s": wait, "gather_port": node.gather_port(),
            "rendezvous_failed": failed and not any(s.get("ranks") for s in got.values()),
            "rendezvous_error": next((s.get("rendezvous_error") for s in got.values()
                                      if s.get("rendezvous_error")), None)}
    if info.get("error"):
        meta["gather_error"] = info["error"]
    if merged is not None:
        from torchdoctor.rules.ranks import rank_outcomes

        meta["rank_outcomes"] = rank_outcomes(merged)
    evs = [{"kind": "node_summary", "node_rank": k, "facts": s.get("facts") if isinstance(s.get("facts"), dict) else {},
            "ranks": s.get("ranks"), "rendezvous": s.get("rendezvous"), "rejected": bool(s.get("rejected")),
            "invalid": (bad or {}).get(k) or []} for k, s in sorted(got.items())]
    view = Report(command=report.command)
    apply_rules("nodes", Evidence(meta=meta, events=evs), view)
    if any(f.code in ("node-lost", "node-never-joined") for f in view.findings):
        _fold_symptoms(report, view)
    stuck = sorted({f.code for f in report.findings if f.code in ("collective-hang", "collective-mismatch")})
    for f in view.findings:
        if f.code == "node-env-mismatch" and stuck:  # settings that differ make collectives disagree
            f.evidence["also_in_this_report"] = (f"{', '.join(stuck)}: a setting that differs between "
                                                 f"nodes is a likely cause")
    report.findings.extend(view.findings)
    report.skipped.extend(view.skipped)


def _fold_symptoms(report: Report, view: Report) -> None:
    """A lost or missing node explains the crashes and hangs of the ranks that waited for it."""
    from torchdoctor.distributed.ranked import DIST_CODES, SYMPTOM_CODES

    folded = [f for f in report.findings if f.code in SYMPTOM_CODES + DIST_CODES]
    if not folded:
        return
    report.findings = [f for f in report.findings if f not in folded]
    lead = next(f for f in view.findings if f.code in ("node-lost", "node-never-joined"))
    lead.evidence["consequences"] = {f.code: f.title[:300] for f in folded}


_RANK = re.compile(r"\brank (\d+)\b(?! \(node)")


def _name_nodes(report: Report, node_of: dict[int, int], got: dict[int, dict[str, Any]]) -> None:
    """'rank 3' in each finding's title becomes 'rank 3 (node 1)' (first mention of each rank)."""
    def host(k: int) -> str | None:
        return ((got.get(k) or {}).get("facts") or {}).get("hostname")

    out = []
    for f in report.findings:
        seen: set[int] = set()

        def sub(m: re.Match[str]) -> str:
            r = int(m.group(1))
            if r not in node_of or r in seen:
                return m.group(0)
            seen.add(r)
            return f"rank {r} (node {node_of[r]})"

        title = _RANK.sub(sub, f.title)
        if seen:
            ev = dict(f.evidence)
            ev["nodes"] = {f"rank {r}": f"node {node_of[r]}" + (f" ({host(node_of[r])})" if host(node_of[r]) else "")
                           for r in sorted(seen)}
            f = Finding(f.code, f.skill, f.severity, title, ev, f.fix, f.docs)
        out.append(f)
    report.findings = out


def _attribute_straggler(report: Report, node_of: dict[int, int]) -> None:
    """A straggler rank: its whole node slow (every rank of it) or that rank alone?"""
    rows = {row["rank"]: row for row in (report.metrics.get("ranks") or {}).get("per_rank") or []}
    for f in report.findings:
        r = f.evidence.get("rank")
        if f.code != "rank-straggler" or r not in node_of:
            continue
        k = node_of[r]
        mates = [q for q, n in sorted(node_of.items()) if n == k and q != r]
        mine = (rows.get(r) or {}).get("own_excess_ms") or 0.0
        if not mates:
            f.evidence["attributed_to"] = (f"node {k} (its only rank): a slow rank and a slow node "
                                           f"look the same with one rank per node")
            continue
        slow = [q for q in mates if ((rows.get(q) or {}).get("own_excess_ms") or 0.0) >= 0.5 * mine]
        f.evidence["attributed_to"] = (
            f"node {k}: all its {len(mates) + 1} ranks do more own work per step (a node-wide cause: "
            f"host, storage, network, CPU or GPU clocks)" if len(slow) == len(mates) else
            f"rank {r} alone: the other ranks of node {k} ({', '.join(map(str, mates))}) are not slower")


def _nodes_metric(got: dict[int, dict[str, Any]], node_of: dict[int, int], report: Report,
                  nnodes: int) -> list[dict[str, Any]]:
    rows = {row["rank"]: row for row in (report.metrics.get("ranks") or {}).get("per_rank") or []}
    for r, row in rows.items():
        row["node"] = node_of.get(r)
    out = []
    for k in range(nnodes):
        s = got.get(k)
        if s is None:
            out.append({"node_rank": k, "reported": False})
            continue
        facts = s.get("facts") if isinstance(s.get("facts"), dict) else {}
        ranks = [r for r, n in sorted(node_of.items()) if n == k]
        meds = [rows[r]["median_step_ms"] for r in ranks if r in rows and "median_step_ms" in rows[r]]
        out.append({"node_rank": k, "reported": True, "hostname": facts.get("hostname"),
                    "ranks": ranks, "gpu": facts.get("gpu"),
                    **({"events_per_kind": s["events_cap"]} if s.get("events_cap") is not None else {}),
                    "median_step_ms": round(statistics.median(meds), 3) if meds else None,
                    "outcome": (s.get("result") or {}).get("outcome") if isinstance(s.get("result"), dict) else None})
    return out
