"""Open a checkpoint path, file or folder: the one entry of the checkpoint readers.

A folder is read by :mod:`torchdoctor.checkpoint.folders` (which reads its files with
:mod:`torchdoctor.checkpoint.detect`); a file by :func:`torchdoctor.checkpoint.detect.read_file`.
"""

from __future__ import annotations

import os

from torchdoctor.checkpoint.detect import check_path, prefetch, read_file
from torchdoctor.checkpoint.folders import read_dir
from torchdoctor.checkpoint.values import Contents


def read(path: str) -> Contents:
    """Read ``path`` into :class:`Contents`; raises :class:`Unreadable` or DoctorError."""
    check_path(path)
    if os.path.isdir(path):
        return read_dir(path)
    prefetch(path)
    return read_file(path)
