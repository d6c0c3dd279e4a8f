"""Optional console sections (tables, bars, timelines) drawn from a report's metrics.

A module in this package defines functions decorated with :func:`section`; each gets
the Report and returns a rich renderable, or None when its metrics are absent. The
console renderer draws them between the header and the findings, in ``order``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

_SECTIONS: list[tuple[int, str, Callable[[Any], Any]]] = []
_loaded = False


def section(name: str, order: int = 50):
    def deco(fn):
        _SECTIONS.append((order, name, fn))
        return fn

    return deco


def sections() -> list[tuple[int, str, Callable[[Any], Any]]]:
    global _loaded
    if not _loaded:
        for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            importlib.import_module(f"{__name__}.{mod}")
        _loaded = True
    return sorted(_SECTIONS, key=lambda t: (t[0], t[1]))
