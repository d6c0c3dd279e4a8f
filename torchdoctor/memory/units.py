"""Byte formatting shared by evidence titles, fixes and the console section."""

from __future__ import annotations

KiB = 1024
MiB = 1024 ** 2
GiB = 1024 ** 3


def human_bytes(n: float | int | None, signed: bool = False) -> str:
    """``1536 -> '1.5 KiB'``; binary units; ``signed`` prefixes '+' for positive values."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    v = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(v)} B"
            return f"{sign}{v:.3g} {unit}" if v < 100 else f"{sign}{v:.0f} {unit}"
        v /= 1024
    return f"{sign}{v:.0f} TiB"  # pragma: no cover
