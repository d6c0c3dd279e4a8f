"""Names for modules and parameters in messages: ``model.encoder.layers.2.attn``.

Root modules are labelled with the script's own variable name when one can be found (the
caller frames' locals, then ``__main__``'s globals), else with the class name in lower case.
Only called when evidence is written (rarely), never on the hot path.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Iterable


def root_label(root: Any, max_frames: int = 60) -> str:
    """The user's variable name for ``root`` (``model``, ``net``), or its class name."""
    try:
        from torchdoctor.runner.frames import is_user_file
    except Exception:  # noqa: BLE001
        def is_user_file(_f: str) -> bool:
            return True
    f = sys._getframe(1)
    n = 0
    while f is not None and n < max_frames:
        if is_user_file(f.f_code.co_filename):
            for k, v in f.f_locals.items():
                if v is root and not k.startswith("_") and k != "self":
                    return k
        f = f.f_back
        n += 1
    main = sys.modules.get("__main__")
    for k, v in list(getattr(main, "__dict__", {}).items()):
        if v is root and not k.startswith("_"):
            return k
    return type(root).__name__.lower()


class Namer:
    """Maps module / parameter objects to dotted names under labelled roots."""

    def __init__(self, roots: Iterable[Any], labels: bool = True):
        self.modules: dict[int, str] = {}
        self.rel: dict[int, tuple[str, str]] = {}  # module id -> (root class, path under root)
        self.params: dict[int, str] = {}
        self._owner: dict[int, Any] = {}  # param id -> module that holds it directly
        self._labels = labels
        for root in roots:
            self.add_root(root)

    def add_root(self, root: Any, label: str | None = None) -> None:
        if id(root) in self.modules:
            return
        label = label or (root_label(root) if self._labels else type(root).__name__.lower())
        for name, m in root.named_modules(remove_duplicate=True):
            self.modules.setdefault(id(m), f"{label}.{name}" if name else label)
            self.rel.setdefault(id(m), (type(root).__name__, name))
            for pn, p in m.named_parameters(recurse=False):
                full = f"{self.modules[id(m)]}.{pn}"
                self.params.setdefault(id(p), full)
                self._owner.setdefault(id(p), m)

    def module(self, m: Any) -> str:
        return self.modules.get(id(m)) or f"<unregistered {type(m).__name__}>"

    def param(self, p: Any, fallback: str | None = None) -> str:
        return self.params.get(id(p)) or fallback or f"<parameter {tuple(p.shape)}>"

    def owner(self, p: Any) -> Any | None:
        return self._owner.get(id(p))


def forward_source(module: Any) -> str | None:
    """'file:line' where ``type(module).forward`` is defined (None for builtins)."""
    try:
        fn = type(module).forward
        fn = inspect.unwrap(fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        return f"{_short(code.co_filename)}:{code.co_firstlineno}"
    except Exception:  # noqa: BLE001
        return None


def is_user_module(module: Any) -> bool:
    """True when the module's forward is defined in the user's files (not torch or a library)."""
    try:
        from torchdoctor.runner.frames import is_user_file

        code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
        return bool(code) and is_user_file(code.co_filename)
    except Exception:  # noqa: BLE001
        return False


def user_stack(limit: int = 6, skip: int = 1) -> list[str]:
    """The user's frames on the current stack, innermost first, as 'file:line in func'."""
    from torchdoctor.runner.frames import is_user_file

    out: list[str] = []
    f = sys._getframe(skip)
    while f is not None and len(out) < limit:
        co = f.f_code
        if is_user_file(co.co_filename):
            out.append(f"{_short(co.co_filename)}:{f.f_lineno} in {co.co_name}")
        f = f.f_back
    return out


def source_line(where: str) -> str | None:
    """The source text at 'file:line[ in func]' (stripped), if readable."""
    import linecache

    try:
        loc = where.split(" in ")[0]
        file, line = loc.rsplit(":", 1)
        path = file if os.path.isabs(file) else os.path.abspath(file)
        text = linecache.getline(path, int(line)).strip()
        return text or None
    except Exception:  # noqa: BLE001
        return None


def _short(path: str) -> str:
    """A path relative to the working directory when it is below it."""
    try:
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel
    except ValueError:
        return path
