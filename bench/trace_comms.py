"""Collective time and exposed time per recorded step, read straight from a torch.profiler Chrome
trace: the reference that the collectives table (torchdoctor/instruments/profile/_profile_comms.py) is
compared with. Independent code on purpose (stdlib only, its own interval arithmetic), same
definition:

* GPU: NCCL kernels (``nccl*``) launched in the recorded steps (their CUDA runtime or driver launch inside
  a ``ProfilerStep#`` range); exposed = their union minus every other kernel, copy and memset.
* CPU (gloo): ``gloo:*`` ranges on gloo's worker threads that start inside the recorded steps;
  exposed = their union minus the training thread's torch ops (``cpu_op``, c10d ops left out).

Used by tests/test_dist_comm.py and bench/fsdp2_collectives.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def _union(iv: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    """Length of the intersection of two unions (each sorted, disjoint)."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            tot += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def load(trace: Path) -> dict:
    p = Path(trace)
    if p.suffix == ".gz":
        with gzip.open(p, "rt") as f:
            return json.load(f)
    return json.loads(p.read_text())


def trace_comms(trace: Path) -> dict:
    """{steps, ms, exposed_ms} per recorded step (ms = the collectives' union)."""
    ev = [e for e in load(trace)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") in ("user_annotation", "cpu_op")]
    if not steps:
        return {"steps": 0, "ms": 0.0, "exposed_ms": 0.0}
    lo, hi = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    main = steps[0]["tid"]
    if any(e.get("cat") == "kernel" for e in ev):
        launched = {e.get("args", {}).get("correlation") for e in ev
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and lo <= e["ts"] < hi}
        dev = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and e.get("args", {}).get("correlation") in launched]
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in dev if e["name"].lower().startswith("nccl")]
        other = [(e["ts"], e["ts"] + e["dur"]) for e in dev if not e["name"].lower().startswith("nccl")]
    else:
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev
                if str(e["name"]).startswith("gloo:") and lo <= e["ts"] < hi]
        other = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "cpu_op" and e["tid"] == main
                 and not str(e["name"]).startswith(("c10d::", "_c10d_functional::"))]
    busy = _union(comm)
    total = sum(e - s for s, e in busy)
    exposed = total - _overlap(busy, _union(other))
    n = len(steps)
    return {"steps": n, "ms": total / 1e3 / n, "exposed_ms": exposed / 1e3 / n}
