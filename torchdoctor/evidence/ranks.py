"""Load the rank dirs of a ranked run into one cross-rank :class:`Evidence` (reading only).

Every event of rank R keeps its kind and gains ``"rank": R``; the files beside the events
become events too, so the cross-rank rules stay pure functions of one Evidence:

* ``rank_result`` {rank, outcome, exit_code, signal, steps, stopped_by_launcher, exception?}
* ``rank_stacks`` {rank, threads, fatal}: the last faulthandler dump of the rank, if any
* ``collective`` {rank, seq, op, shapes, dtype, site, fn, step, t, g?}: the recorder's lines
* ``fr_entries`` {rank, api, entries: [{seq, pg, op, sizes, dtypes, state, completed}]}:
  the tail of the flight recorder dump, if one was written (``source``: ``watcher``, the
  rank's own thread, or ``nccl-pipe``, NCCL's watchdog poked through the pipe)

``meta``: {probe, world_size, options}; ``result``: the merged top-level result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchdoctor.distributed.rankdir import COLLECTIVES, COLLECTIVES_OLD, FR_DUMP_STEM, FR_TRACE, rank_dir
from torchdoctor.evidence import Evidence
from torchdoctor.runner.rundir import META, RESULT, STACKS, read_json

FR_KEEP = 200  # flight recorder entries kept per rank (the most recent)


def read_collectives(d: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in (COLLECTIVES_OLD, COLLECTIVES):
        p = d / name
        if not p.exists():
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a torn last line (killed mid-write)
    return out


def read_fr(d: Path, nccl_dump: Path | None = None) -> dict[str, Any] | None:
    """The flight recorder dump of one rank, reduced to what the rules compare: the one the
    rank's watcher thread wrote (``fr_trace.json``) or the one NCCL's watchdog wrote when its
    pipe was poked (``nccl_dump``, torch's pickle), whichever holds more entries."""
    from torchdoctor.distributed.frpipe import read_dump

    found = []
    try:
        data = json.loads((d / FR_TRACE).read_text(errors="replace"))
        if isinstance(data, dict):
            found.append(("watcher", data))
    except (OSError, ValueError):
        pass
    if nccl_dump is not None and nccl_dump.is_file():
        data = read_dump(nccl_dump)
        if data is not None:
            found.append(("nccl-pipe", data))
    if not found:
        return None
    source, data = max(found, key=lambda f: len(f[1].get("entries") or []))
    return {**_reduce_fr(data), "source": source}


def _reduce_fr(data: dict[str, Any]) -> dict[str, Any]:
    entries = []
    for e in (data.get("entries") or [])[-FR_KEEP:]:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group") or [None, None]
        pg = list(pg) if isinstance(pg, tuple) else pg
        state = e.get("state")
        entries.append({
            "seq": e.get("collective_seq_id"), "p2p_seq": e.get("p2p_seq_id"),
            "pg": pg[1] if isinstance(pg, list) and len(pg) > 1 else pg,
            "op": e.get("profiling_name"), "sizes": e.get("input_sizes"),
            "dtypes": e.get("input_dtypes"), "state": state, "p2p": bool(e.get("is_p2p")),
            "completed": state == "completed" or bool(e.get("time_discovered_completed_ns")),
        })
    return {"entries": entries, "version": data.get("version")}


def rank_labels(run_dir: str | Path, nproc: int) -> dict[int, int]:
    """One node of a multi-node job: {local rank: global rank} of the ranks that started (each
    rank wrote its global rank in its meta.json; torchrun's rendezvous chose it)."""
    out: dict[int, int] = {}
    for r in range(nproc):
        meta = read_json(rank_dir(run_dir, r) / META) or {}
        if isinstance(meta.get("rank"), int):
            out[r] = meta["rank"]
    return out


def merged_evidence(run_dir: str | Path, nproc: int, labels: dict[int, int] | None = None
                    ) -> tuple[dict[int, Evidence], Evidence]:
    """({rank: that rank's Evidence}, the cross-rank Evidence) of a ranked run dir.

    ``labels`` (a node of a multi-node job): {local rank: global rank}; the dirs are by local
    rank, the events are labelled by global rank, and a local rank that never started (no
    global rank known) is left to the node's own result.
    """
    from torchdoctor.runner.stacks import read_stacks

    top = Path(run_dir)
    per: dict[int, Evidence] = {}
    events: list[dict[str, Any]] = []
    for local in range(nproc):
        d = rank_dir(top, local)
        r = labels.get(local) if labels is not None else local
        if r is None:
            continue
        if not d.is_dir():
            events.append({"kind": "rank_result", "rank": r, "outcome": "not_started"})
            continue
        ev = Evidence.load(d)
        per[r] = ev
        events.extend({**e, "rank": r} for e in ev.events)
        events.append({"kind": "rank_result", **ev.result, "rank": r})
        if (d / STACKS).exists():
            st = read_stacks(d / STACKS)
            if st.get("threads") or st.get("fatal"):
                events.append({"kind": "rank_stacks", "rank": r, **st})
        events.extend({"kind": "collective", "rank": r, **c} for c in read_collectives(d))
        fr = read_fr(d, top / f"{FR_DUMP_STEM}{r}")
        if fr is not None:
            events.append({"kind": "fr_entries", "rank": r, **fr})
    meta = read_json(top / META) or {}
    meta = {"probe": meta.get("probe"), "world_size": nproc, "options": meta.get("options", {}),
            "argv": meta.get("argv")}
    result = read_json(top / RESULT) or {}
    return per, Evidence(meta=meta, events=events, result=result, run_dir=top)
