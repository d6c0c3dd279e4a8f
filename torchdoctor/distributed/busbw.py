"""Bandwidth arithmetic as nccl-tests defines it (doc/PERFORMANCE.md of NVIDIA/nccl-tests).

algbw = bytes / time; for all-reduce, busbw = algbw * 2(n-1)/n: the per-rank link traffic of
an optimal ring, comparable to the hardware's peak per-direction link bandwidth whatever n is.
Units: bytes, seconds in; GB/s (1e9 bytes per second) out.
"""

from __future__ import annotations

GB = 1e9


def allreduce_factor(n: int) -> float:
    """busbw / algbw for all-reduce on ``n`` ranks (0 for a single rank: nothing moves)."""
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def allreduce_bandwidth(nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce of ``nbytes`` taking ``seconds`` on ``n`` ranks."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    algbw = nbytes / seconds / GB
    return algbw, algbw * allreduce_factor(n)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("median of nothing")
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
