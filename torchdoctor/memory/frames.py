"""User frames of live Python stacks and of CUDA snapshot blocks, and how a site is named.

"User" is decided by :func:`torchdoctor.runner.frames.is_user_file` (not stdlib,
site-packages, torch or torchdoctor), cached per file name.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.runner.frames import is_user_file, short_path

Frame = tuple  # (filename, line, function)


def user_frames_from_frame(frame: Any, limit: int = 3) -> tuple[Frame, ...]:
    """Up to ``limit`` user frames (innermost first) walking out from a live frame object."""
    out = []
    f = frame
    while f is not None and len(out) < limit:
        co = f.f_code
        if is_user_file(co.co_filename):
            out.append((co.co_filename, f.f_lineno, co.co_name))
        f = f.f_back
    return tuple(out)


def user_frames_from_snapshot(frames: list[dict[str, Any]], limit: int = 3) -> tuple[Frame, ...]:
    """Up to ``limit`` user frames (innermost first) of a CUDA snapshot block's ``frames``."""
    out = []
    for fr in frames or ():
        fn = fr.get("filename", "")
        if is_user_file(fn):
            out.append((fn, int(fr.get("line", 0)), fr.get("name", "")))
            if len(out) >= limit:
                break
    return tuple(out)


def loc(frame: Frame) -> str:
    """'dir/train.py:42' (relative to the working directory when inside it)."""
    return short_path(f"{frame[0]}:{frame[1]}") or "?"


def fmt_site(frames: tuple[Frame, ...]) -> str:
    """The innermost user frame as 'file:line' ('?' when there is none)."""
    return loc(frames[0]) if frames else "?"
