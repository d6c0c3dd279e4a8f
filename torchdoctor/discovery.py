"""Plug-in discovery: a registry package imports each of its modules once, so that a new
code family, rule, instrument, probe helper or console section is just a new file."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Iterable

_done: set[str] = set()


def import_submodules(package: str, path: Iterable[str], recursive: bool = False) -> None:
    """Import every module of ``package`` (whose ``__path__`` is ``path``), once per process;
    with ``recursive``, the modules of its sub-packages too (depth first, in name order)."""
    if package in _done:
        return
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        mod = importlib.import_module(f"{package}.{info.name}")
        if recursive and info.ispkg:
            import_submodules(mod.__name__, mod.__path__, recursive=True)
    _done.add(package)
