"""What dynamo compiled in this process so far, as plain numbers (from its own counters, read
through torchdoctor/torch_internals.py): for the treat compile trial's entry and the FLOP
counter's "set to compile, not compiled yet" check."""

from __future__ import annotations


def dynamo_counts() -> dict[str, int] | None:
    """Frames seen and compiled, graphs, ops captured in them, graph breaks; None when dynamo
    was never imported or keeps no such counters."""
    from torchdoctor.torch_internals import dynamo_counters

    counters = dynamo_counters()
    if counters is None:
        return None
    try:
        return {"frames": int(counters["frames"].get("total", 0)), "frames_ok": int(counters["frames"].get("ok", 0)),
                "graphs": int(counters["stats"].get("unique_graphs", 0)),
                "ops_captured": int(counters["stats"].get("calls_captured", 0)),
                "graph_breaks": int(sum(counters["graph_break"].values()))}
    except Exception:  # noqa: BLE001
        return None
