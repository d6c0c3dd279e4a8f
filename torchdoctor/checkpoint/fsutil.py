"""File-system checks made before a checkpoint file is opened.

A FIFO, socket or device named like a checkpoint (``optimizer.pt``, ``.metadata``) blocks
``open()`` or ``read()`` forever; a symbolic link inside a checkpoint folder may point
anywhere on the machine. So every file is checked with ``os.stat`` before it is opened
(``S_ISREG``), opened with ``O_NONBLOCK`` and checked again on the open descriptor (no
race with a file swapped in between), and links inside a folder are followed only when
they stay inside it.
"""

from __future__ import annotations

import os
import stat

KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def kind(mode: int) -> str:
    for test, what in KINDS:
        if test(mode):
            return what
    return "not a regular file"


def not_regular(path: str, root: str | None = None) -> str | None:
    """Why ``path`` must not be opened as a file (None when it is a plain regular file).

    With ``root``, a symbolic link whose target lies outside ``root`` is refused too.
    """
    try:
        lst = os.lstat(path)
    except OSError as e:
        return f"cannot stat: {e.strerror or type(e).__name__}"
    if stat.S_ISLNK(lst.st_mode) and root is not None:
        real, base = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, base]) != base:
            return "a symbolic link to a file outside the checkpoint folder (not followed)"
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot stat: {e.strerror or type(e).__name__}"
    if not stat.S_ISREG(st.st_mode):
        return kind(st.st_mode)
    return None


def open_regular(path: str):
    """``open(path, "rb")`` that never blocks on a FIFO/device: raises OSError for non-regular files."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{kind(st.st_mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class NotRegular(OSError):
    """The path is a FIFO, socket, device or directory where a file was expected."""
