"""A read-only window ``[base, base+length)`` of a file, seen as a file of its own.

DCP stores each tensor as a whole ``torch.save`` zip inside a bigger ``.distcp`` file;
``zipfile`` reads such an embedded archive through this window.
"""

from __future__ import annotations

import io
import os


class FileWindow(io.RawIOBase):
    def __init__(self, path: str, base: int = 0, length: int | None = None):
        super().__init__()
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        size = os.fstat(self._f.fileno()).st_size
        self.base = base
        self.length = (size - base) if length is None else min(length, max(0, size - base))
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            pos = offset
        elif whence == 1:
            pos = self._pos + offset
        else:
            pos = self.length + offset
        if pos < 0:
            raise OSError("negative seek position")
        self._pos = pos
        return pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.length - self._pos))
        if n == 0:
            return 0
        got = os.preadv(self._f.fileno(), [memoryview(b)[:n]], self.base + self._pos)
        self._pos += got
        return got

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


def open_window(path: str, base: int = 0, length: int | None = None) -> io.BufferedReader:
    """A buffered, seekable reader over the window (what zipfile and pickle expect)."""
    return io.BufferedReader(FileWindow(path, base, length), buffer_size=1 << 16)
