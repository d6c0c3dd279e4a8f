"""Memory per rank of a ranked run: each rank's peak and the skew across ranks (pure).

The basis is the one every rank measured: the CUDA allocator's peak allocated bytes (summed over
the rank's devices, from ``mem_end`` or the last ``mem`` sample), else the peak host RSS of the
``mem`` samples, else the peak of the host heap in use. Sharded training (FSDP2, tensor
parallel) should be even across ranks; a rank well above the others holds something the others
do not (an unsharded module, rank-0-only logging or evaluation, an uneven shard).

Output (``metrics.memory.by_rank``): {basis, per_rank: [{rank, peak_bytes}], max_bytes,
min_bytes, spread_bytes, skew, even, max_rank, min_rank} where skew = max / min (None when the
minimum is 0). Ranks within ``EVEN_SKEW`` of each other are ``even`` and no rank is named
(max_rank / min_rank None): host RSS moves by a few hundred KiB between two ranks doing the
same work (2-rank FSDP2 fixture on CPU: 337.06 vs 337.19 MB, skew 1.0004).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.evidence.memory import cuda_end_stats

BASES = ("cuda_peak_allocated", "host_rss_peak", "host_heap_peak")
EVEN_SKEW = 1.05  # max / min below this: the ranks' peaks are even (noise), no rank named


def rank_peaks(ev: Evidence) -> dict[str, int]:
    """{basis: peak bytes} of one rank, for each basis it measured."""
    out: dict[str, int] = {}
    end = cuda_end_stats(ev)
    cuda = [v.get("peak_allocated") for v in end.values() if isinstance(v, dict)]
    if cuda and all(isinstance(x, int) for x in cuda):
        out["cuda_peak_allocated"] = sum(cuda)
    for key, basis in (("rss", "host_rss_peak"), ("heap", "host_heap_peak")):
        vals = [m.get(key) for m in ev.of("mem") if isinstance(m.get(key), int)]
        if vals:
            out[basis] = max(vals)
    return out


def memory_by_rank(per: dict[int, Evidence]) -> dict[str, Any] | None:
    """Peaks and skew across ranks on the first basis every rank has (None: fewer than two
    ranks measured, or no common basis)."""
    peaks = {r: rank_peaks(ev) for r, ev in sorted(per.items())}
    peaks = {r: p for r, p in peaks.items() if p}
    if len(peaks) < 2:
        return None
    basis = next((b for b in BASES if all(b in p for p in peaks.values())), None)
    if basis is None:
        return None
    rows = [{"rank": r, "peak_bytes": p[basis]} for r, p in peaks.items()]
    hi = max(rows, key=lambda x: (x["peak_bytes"], -x["rank"]))
    lo = min(rows, key=lambda x: (x["peak_bytes"], x["rank"]))
    skew = hi["peak_bytes"] / lo["peak_bytes"] if lo["peak_bytes"] else None
    even = skew is not None and skew < EVEN_SKEW
    return {"basis": basis, "per_rank": rows, "max_bytes": hi["peak_bytes"],
            "min_bytes": lo["peak_bytes"], "spread_bytes": hi["peak_bytes"] - lo["peak_bytes"],
            "skew": round(skew, 4) if skew is not None else None, "even": even,
            "max_rank": None if even else hi["rank"], "min_rank": None if even else lo["rank"]}
