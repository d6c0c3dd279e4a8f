"""The collectives table of a ranked run, per rank (pure: the ranks' Evidence in, a dict out).

Each rank's profiler window measured its collectives (``profile_collectives``, from
``instruments/profile/_profile_comms.py``): per kind (all_gather, reduce_scatter, all_reduce, all_to_all,
broadcast), ms per step, the part exposed (nothing else ran) and overlapped, bytes and bus
bandwidth. Here they become ``metrics.collectives``::

    {"basis": "device" | "host", "note": str, "world": 2,
     "per_rank": [{"rank": 0, "steps": [7, 8], "profiled_step_ms": 605.1, "step_ms": 41.0,
                   "total": {"ms", "exposed_ms", "overlapped_ms", "exposed_share", "share_of"},
                   "kinds": {"all_gather": {"calls_per_step", "ms", "exposed_ms", "overlapped_ms",
                                            "bytes_per_step", "busbw_gbs"}, ...},
                   "per_step": [{"step", "ms", "exposed_ms", "step_ms"}]}, ...]}

``step_ms`` is the un-profiled step time (the profile rules' basis: the profiler's Python tracer
slows the host during the recorded steps, not the GPU); ``exposed_share`` = exposed ms / that on the
device basis, / ``profiled_step_ms`` (the recorded steps' own length) on the host basis, whose gloo
ranges the tracer slows like the step (``share_of`` says which). None when no rank measured a collective.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.evidence.profile import bare_clock

NOTES = {
    "device": "NCCL kernels on the GPU timeline; exposed = no other GPU work ran meanwhile",
    "host": ("gloo runs each collective on a worker thread and the training thread waits for it: "
             "exposed = the training thread ran no torch op meanwhile. On CPU the worker and the "
             "training thread share the cores, so this is not a GPU's free overlap: not judged"),
}


def unprofiled_step_ms(ev: Evidence) -> float | None:
    """The rank's un-profiled median step time (ms), as the profile rules take it."""
    w = ev.last("profile_window")
    if not w:
        return None
    clock = bare_clock(ev, w)
    return float(clock["step_ms"]) if clock else None


def rank_row(rank: int, ev: Evidence) -> dict[str, Any] | None:
    t = ev.last("profile_collectives")
    if not t or (ev.last("profile_window") or {}).get("status") != "ok":
        return None  # a partial window: the run ended inside it, it holds what ran after the last step
    total = dict(t.get("total") or {})
    step_ms = unprofiled_step_ms(ev)
    if step_ms and t.get("basis") == "device":  # the GPU timeline: not slowed by the Python tracer
        total["exposed_share"] = round(float(total.get("exposed_ms") or 0.0) / step_ms, 4)
        total["share_of"] = "un-profiled step"
    elif t.get("step_ms"):  # gloo: host ranges, slowed by the tracer like the recorded step itself
        total["share_of"] = "profiled step"
    return {"rank": rank, "basis": t.get("basis"), "steps": [s["step"] for s in t.get("per_step") or []],
            "profiled_step_ms": t.get("step_ms"), "step_ms": step_ms, "total": total,
            "kinds": t.get("kinds") or {}, "per_step": t.get("per_step") or [],
            "unpaired": t.get("unpaired", 0)}


def collectives_by_rank(per: dict[int, Evidence]) -> dict[str, Any] | None:
    rows = [row for r, ev in sorted(per.items()) if (row := rank_row(r, ev)) is not None]
    if not rows:
        return None
    bases = {row.pop("basis") for row in rows}
    basis = "device" if bases == {"device"} else "host" if bases == {"host"} else "mixed"
    world = next((ev.last("profile_collectives") or {}).get("world") for ev in per.values()
                 if ev.last("profile_collectives"))
    return {"basis": basis, "note": NOTES.get(basis, "ranks measured on different bases"),
            "world": world, "per_rank": rows}
