"""Plug-in discovery: a registry package imports each of its modules once, so that a new
code family, rule, instrument, probe helper or console section is just a new file."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Iterable

_done: set[str] = set()


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (whose ``__path__`` is ``path``), once per process."""
    if package in _done:
        return
    for name in sorted(m.name for m in pkgutil.iter_modules(list(path))):
        importlib.import_module(f"{package}.{name}")
    _done.add(package)
