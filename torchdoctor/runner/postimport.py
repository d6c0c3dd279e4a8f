"""Run a callback when a module is imported, without importing it ourselves.

An instrument that wraps a heavy optional module (``torch.distributed.checkpoint``: ≈ 1-4 s to
import on the CPU box) must not import it at start-up for a script that never uses it, yet must
wrap it before the script's first call. :func:`when_imported` does both: when the module is
already in ``sys.modules`` the callback runs at once; otherwise a finder placed first on
``sys.meta_path`` lets the other finders find the module as usual and wraps only the loader's
``exec_module``, so that the callback runs once, right after the module's own code (before the
``import`` statement that asked for it returns). The finder answers for that one name only and
is removed by :meth:`Handle.remove` (the instrument's uninstall) or after the callback ran.

The callback runs in the importing thread; an exception it raises is passed to ``on_error``
(the import itself always succeeds as it would without torchdoctor).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable


class _Loader(importlib.abc.Loader):
    """The module's own loader, with the callback after ``exec_module``; every other attribute
    (resource readers, ``get_source``) is the original's."""

    def __init__(self, orig: Any, handle: "Handle") -> None:
        self._orig = orig
        self._handle = handle

    def create_module(self, spec: Any) -> Any:
        return self._orig.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            module.__loader__ = self._orig
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._orig
        except (AttributeError, TypeError):
            pass
        self._orig.exec_module(module)
        self._handle.fire(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._orig, name)


class Handle(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[Any], None], on_error: Callable[[], None] | None) -> None:
        self.name = name
        self.callback = callback
        self.on_error = on_error
        self.fired = False
        self._local = threading.local()
        self._lock = threading.Lock()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self.fired or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._local.busy = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec

    def fire(self, module: Any) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        self.remove()
        try:
            self.callback(module)
        except Exception:  # noqa: BLE001 - the script's import goes on
            if self.on_error is not None:
                self.on_error()

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def when_imported(name: str, callback: Callable[[Any], None],
                  on_error: Callable[[], None] | None = None) -> Handle:
    """Run ``callback(module)`` once ``name`` is imported (now, when it already is)."""
    h = Handle(name, callback, on_error)
    mod = sys.modules.get(name)
    if mod is not None:
        h.fire(mod)
        return h
    sys.meta_path.insert(0, h)
    return h
