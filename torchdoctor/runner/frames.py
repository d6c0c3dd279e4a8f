"""Which source files are the user's: everything but torch, torchdoctor, site-packages, stdlib."""

from __future__ import annotations

import functools
import os
import sysconfig

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../torchdoctor
_EXAMPLES_DIR = os.path.join(_PKG_DIR, "examples") + os.sep


def _library_roots() -> tuple[str, ...]:
    roots = {_PKG_DIR + os.sep}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p) + os.sep)
            roots.add(os.path.abspath(p) + os.sep)
    try:
        import torch

        roots.add(os.path.dirname(os.path.realpath(torch.__file__)) + os.sep)
    except Exception:  # noqa: BLE001
        pass
    return tuple(roots)


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True for the script's own files (and its sibling modules), False for libraries."""
    if not filename or filename.startswith("<"):
        return False
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    path = os.path.abspath(filename)
    if path.startswith(_EXAMPLES_DIR):  # the bundled demo scripts play the user's part
        return True
    return not path.startswith(_library_roots_cached())


@functools.lru_cache(maxsize=1)
def _library_roots_cached() -> tuple[str, ...]:
    return _library_roots()


_TOOL_DIR = _PKG_DIR + os.sep


def is_torchdoctor_file(filename: str) -> bool:
    """A file of torchdoctor's own package (the bundled examples play the user's part)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return path.startswith(_TOOL_DIR) and not path.startswith(_EXAMPLES_DIR)


def torchdoctor_origin(tb) -> list | None:
    """``[file, line, function]`` of the torchdoctor frame an exception was raised in, when it was
    raised by torchdoctor's own code running inside the user's (a hook, an instrument's
    measurement): the innermost frame of ours, below every user frame, that is not a
    pass-through (``runner/patching.py`` ``PASSTHROUGH_CODES``: a wrapper calling what the user
    called), with a user frame further out. None for an exception of the user's code or of a
    library the user called (also through our wrappers), and for one before the script ran."""
    from torchdoctor.runner.patching import PASSTHROUGH_CODES

    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    for i in range(len(frames) - 1, -1, -1):
        code, line = frames[i]
        fn = code.co_filename
        if is_user_file(fn):
            return None
        if is_torchdoctor_file(fn) and code not in PASSTHROUGH_CODES:
            if any(is_user_file(c.co_filename) for c, _l in frames[:i]):
                return [fn, line, code.co_name]
            return None
    return None


def frames_of(tb) -> list[list]:
    """A traceback as [[file, line, func, is_user_code], ...], outermost first."""
    out = []
    while tb is not None:
        co = tb.tb_frame.f_code
        out.append([co.co_filename, tb.tb_lineno, co.co_name, is_user_file(co.co_filename)])
        tb = tb.tb_next
    return out


def short_path(loc: str | None) -> str | None:
    """'/cwd/dir/train.py:12' -> 'dir/train.py:12' when under the current folder."""
    if not loc:
        return loc
    path, sep, rest = loc.rpartition(":")
    if not rest.isdigit():
        path, sep, rest = loc, "", ""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return loc
    if rel.startswith(".."):
        return loc
    return rel + sep + rest


def user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """The nearest caller frame outside torch/torchdoctor/stdlib, as (file, line, function).
    ``depth`` counts from this function's own frame (2: the caller of its caller)."""
    import sys

    f = sys._getframe(depth)
    while f is not None:
        co = f.f_code
        if is_user_file(co.co_filename):
            return (co.co_filename, f.f_lineno, co.co_name)
        f = f.f_back
    return None
