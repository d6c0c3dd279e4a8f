"""Per-step memory series read back from evidence (pure: Evidence in, numbers out).

Shared by the rules (trend judgment) and the metrics provider (timeline), so both look at
exactly the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchdoctor.evidence import Evidence


@dataclass(frozen=True)
class Series:
    key: str  # "cuda:0" | "heap" | "rss"
    label: str  # what it measures, for titles
    steps: list[int]
    values: list[int]
    noisy: bool = False  # RSS: page-level noise, judged with larger thresholds


def memory_series(ev: Evidence) -> list[Series]:
    """Step-boundary series: CUDA allocated per device, then the host heap (or RSS when the
    heap counter is unavailable). Heap samples flagged ``window`` are left out."""
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
        out.append(Series("heap", "host memory in use (C heap: CPU tensors, autograd graph)",
                          [s for s, _ in heap], [int(v) for _, v in heap]))
    else:
        rss = [(int(m["step"]), m.get("rss")) for m in mems if m.get("rss") is not None]
        if rss:
            out.append(Series("rss", "host resident memory (RSS)", [s for s, _ in rss],
                              [int(v) for _, v in rss], noisy=True))
    return out


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
