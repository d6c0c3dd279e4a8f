"""Optional console sections (tables, bars, timelines) drawn from a report's metrics.

A module in this package defines functions decorated with :func:`section`; each gets
the Report and returns a rich renderable, or None when its metrics are absent. The
console renderer draws them between the header and the findings, in ``order``.
"""

from __future__ import annotations

from typing import Any, Callable

from torchdoctor.discovery import import_submodules

_SECTIONS: list[tuple[int, str, Callable[[Any], Any]]] = []


def section(name: str, order: int = 50):
    def deco(fn):
        _SECTIONS.append((order, name, fn))
        return fn

    return deco


def sections() -> list[tuple[int, str, Callable[[Any], Any]]]:
    import_submodules(__name__, __path__)
    return sorted(_SECTIONS, key=lambda t: (t[0], t[1]))
