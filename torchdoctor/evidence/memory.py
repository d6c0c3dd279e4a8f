"""Per-step memory series read back from evidence (pure: Evidence in, numbers out).

Shared by the rules (trend judgment) and the metrics provider (timeline), so both look at
exactly the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchdoctor.evidence import Evidence

SHIFT_MIN_SIDE = 3  # samples needed on each side of the site window to remove its level shift
SHIFT_MAX_POINTS = 60  # per side, thinned: the pooled slope is O(n^2) in pairs


@dataclass(frozen=True)
class Series:
    key: str  # "cuda:0" | "heap" | "rss"
    label: str  # what it measures, for titles
    steps: list[int]
    values: list[int]
    noisy: bool = False  # RSS: page-level noise, judged with larger thresholds


def memory_series(ev: Evidence) -> list[Series]:
    """Step-boundary series: CUDA allocated per device, then the host heap (or RSS when the
    heap counter is unavailable). Heap samples flagged ``window`` are left out and the
    window's level shift is removed from the heap samples after it
    (:func:`without_window_shift`)."""
    mems = ev.of("mem")
    out: list[Series] = []
    devs: dict[str, tuple[list[int], list[int]]] = {}
    for m in mems:
        for d, vals in (m.get("cuda") or {}).items():
            s, v = devs.setdefault(d, ([], []))
            s.append(int(m["step"]))
            v.append(int(vals[0]))
    for d, (s, v) in sorted(devs.items()):
        out.append(Series(f"cuda:{d}", f"CUDA allocated memory on cuda:{d}", s, v))
    # heap samples taken while the site window ran include its own bookkeeping: left out
    heap = [(int(m["step"]), m.get("heap")) for m in mems
            if m.get("heap") is not None and not m.get("window")]
    if devs and (ev.last("mem_info") or {}).get("history_trace"):
        heap = []  # the CUDA alloc/free trace ring fills host memory: not a signal
    if heap:
        flagged = [int(m["step"]) for m in mems if m.get("heap") is not None and m.get("window")]
        steps = [s for s, _ in heap]
        values = [int(v) for _, v in heap]
        if flagged:
            values = without_window_shift(steps, values, min(flagged), max(flagged))
        out.append(Series("heap", "host memory in use (C heap: CPU tensors, autograd graph)",
                          steps, values))
    else:
        rss = [(int(m["step"]), m.get("rss")) for m in mems if m.get("rss") is not None]
        if rss:
            out.append(Series("rss", "host resident memory (RSS)", [s for s, _ in rss],
                              [int(v) for _, v in rss], noisy=True))
    return out


def without_window_shift(steps: list[int], values: list[int], lo: int, hi: int) -> list[int]:
    """``values`` with the site window's level shift taken out of the samples after it.

    The window (steps ``lo``..``hi``, their samples already left out) traces Python
    allocations and tensor creations; starting and stopping that leaves the C heap displaced
    by a one-off amount that depends on the allocator's state, not on the script (measured
    on growing_batch.py, 16 KiB/step: -8 KiB to +103 KiB across the same window, flipped by
    an inherited environment variable). Left in, that step reads as growth while the window
    watched, or breaks the fit of a small leak (R^2 0.78 on leak_loss_graph.py).

    The shift is the jump between the samples before and after the window beyond their
    common trend: pooled slope = median of the pairwise slopes *within* each side (the
    window's jump is in no pair), shift = median(after - slope*x) - median(before - slope*x).
    A steady leak is in the slope on both sides and stays; only the jump goes. Unchanged
    when either side has fewer than :data:`SHIFT_MIN_SIDE` samples (warm-up excluded).
    """
    from statistics import median

    from torchdoctor.memory.trend import warmup_count

    w = warmup_count(len(steps))
    pre = [(s, v) for i, (s, v) in enumerate(zip(steps, values)) if s < lo and i >= w]
    post = [(s, v) for s, v in zip(steps, values) if s > hi]
    if len(pre) < SHIFT_MIN_SIDE or len(post) < SHIFT_MIN_SIDE:
        return list(values)
    pre, post = thin(pre, SHIFT_MAX_POINTS), thin(post, SHIFT_MAX_POINTS)
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for side in (pre, post)
              for i, a in enumerate(side) for b in side[i + 1:] if b[0] != a[0]]
    slope = median(slopes)
    shift = (median(v - slope * s for s, v in post) - median(v - slope * s for s, v in pre))
    return [v - round(shift) if s > hi else v for s, v in zip(steps, values)]


def capacity_of(ev: Evidence, key: str) -> tuple[int | None, int | None]:
    """(capacity, currently free-ish) for a series: a CUDA device's total memory, or the
    host's total and available memory at the start."""
    if key.startswith("cuda:"):
        idx = int(key.split(":")[1])
        for d in ev.of("mem_device"):
            if int(d.get("index", -1)) == idx:
                return d.get("capacity"), None
        return None, None
    host = (ev.last("mem_info") or {}).get("host") or {}
    return host.get("total"), host.get("available")


def room_left(ev: Evidence, s: Series) -> int | None:
    """Bytes left before ``s`` is full: a device's capacity minus what is allocated now, or the
    host's available memory at the start minus what the heap has grown since the script began."""
    cap, avail = capacity_of(ev, s.key)
    now = s.values[-1] if s.values else 0
    if s.key.startswith("cuda:"):
        return cap - now if cap else None
    if avail is None:
        return cap - now if cap else None
    base = (ev.last("mem_info") or {}).get("baseline_rss" if s.key == "rss" else "baseline_heap")
    return int(avail - max(0, now - base)) if base is not None else int(avail)


def step_seconds(ev: Evidence) -> float | None:
    """Median time of a training step (the step clock's ``step`` events, by the one step-time
    basis: on CUDA the longer of host wall and device span), or None."""
    from statistics import median

    from torchdoctor.evidence import step_seconds as times_of

    walls = times_of(ev, [e for e in ev.of("step") if e.get("wall_s")])[0]
    return median(walls) if walls else None


def cuda_end_stats(ev: Evidence) -> dict[str, dict[str, int]]:
    """Final allocator statistics per device ("0": {...}) from ``mem_end``, else the last
    ``mem`` sample's peaks."""
    end = ev.last("mem_end") or {}
    if end.get("cuda"):
        return {str(k): v for k, v in end["cuda"].items()}
    last = ev.last("mem") or {}
    out = {}
    for d, vals in (last.get("cuda") or {}).items():
        out[str(d)] = {"allocated": vals[0], "reserved": vals[1], "peak_allocated": vals[2],
                       "peak_reserved": vals[3]}
    return out


def thin(values: list[Any], n: int) -> list[Any]:
    """At most ``n`` evenly spaced items (first and last kept)."""
    if len(values) <= n:
        return list(values)
    idx = sorted({round(i * (len(values) - 1) / (n - 1)) for i in range(n)})
    return [values[i] for i in idx]
