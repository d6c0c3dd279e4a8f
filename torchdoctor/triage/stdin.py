"""`ask -`: read a log from stdin within bounds of memory and time.

Errors are usually at the end of a log, so what is kept is the first ``HEAD_BYTES`` and the last
``TAIL_BYTES``; the bytes between them are read through (counting their lines) but not kept, and a
marker line stands in for them, so line numbers after it are the log's own. Reading stops at
end of input, or:

- ``QUIET_S`` seconds without new input once some has arrived, on a pipe that stays open
  (``tail -f log |``);
- ``WAIT_S`` seconds after the first input while input keeps coming (a live job's output);

(neither on a terminal, where a person pastes and ends with Ctrl-D);
- ``READ_MAX`` bytes read through a pipe (``yes |``): the rest of the stream is not read.

A regular file on stdin (``ask - < train.log``) is not read through: its head and tail are read
directly. Waiting uses ``select`` (no busy loop). Memory: the head, the tail and one chunk.
"""

from __future__ import annotations

import os
import select
import stat
import time
from collections import deque
from dataclasses import dataclass, field

HEAD_BYTES = 1 << 20  # 1 MiB
TAIL_BYTES = 256 << 10  # 256 KiB
QUIET_S = 2.0
WAIT_S = 10.0
READ_MAX = 256 << 20  # 256 MiB
CHUNK = 64 << 10


@dataclass
class StdinText:
    text: str
    gap: tuple[int, int] | None = None  # (line index of the marker, lines it stands for)
    limits: list[str] = field(default_factory=list)  # what bounded the read, for the answer
    bytes_read: int = 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


CAP_TEXT = f"the first {_size(HEAD_BYTES)} and the last {_size(TAIL_BYTES)}"


class _Keeper:
    """Keeps the head and a rolling tail of a byte stream; counts what falls between them."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.skipped = 0
        self.skipped_lines = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        while self.tail_len - len(self.tail[0]) >= TAIL_BYTES:
            self._drop(self.tail.popleft())

    def _drop(self, b: bytes) -> None:
        self.tail_len -= len(b)
        self.skipped += len(b)
        self.skipped_lines += b.count(b"\n")

    def result(self) -> tuple[bytes, int, int, bytes]:
        """(head, bytes skipped, lines skipped, tail), cut at line boundaries when there is a gap."""
        tail = b"".join(self.tail)
        if len(tail) > TAIL_BYTES:
            self._drop(tail[:len(tail) - TAIL_BYTES])
            tail = tail[len(tail) - TAIL_BYTES:]
        head = bytes(self.head)
        if not self.skipped:
            return head + tail, 0, 0, b""
        return _stitch(head, self.skipped, self.skipped_lines, tail)


def _stitch(head: bytes, skipped: int, lines: int, tail: bytes) -> tuple[bytes, int, int, bytes]:
    """Move the partial last line of the head and partial first line of the tail into the gap."""
    cut = head.rfind(b"\n")
    if cut >= 0:
        skipped += len(head) - cut - 1
        head = head[:cut + 1]
    nl = tail.find(b"\n")
    if nl >= 0:
        skipped += nl + 1
        lines += 1
        tail = tail[nl + 1:]
    return head, skipped, lines, tail


def _decode(head: bytes, skipped: int, lines: int, tail: bytes, total: int) -> StdinText:
    if not skipped:
        return StdinText(head.decode("utf-8", errors="replace"), bytes_read=total)
    head_text = head.decode("utf-8", errors="replace")
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    marker = (f"[torchdoctor: {skipped} bytes ({lines} lines) of the input not read here: "
              f"ask keeps {CAP_TEXT}]")
    gap = (head_text.count("\n"), max(lines, 1))
    text = head_text + marker + "\n" + tail.decode("utf-8", errors="replace")
    limit = (f"stdin of {_size(total)}: read {CAP_TEXT}; {_size(skipped)} ({lines} lines) between "
             f"them not read (line numbers after the gap are the log's own)")
    return StdinText(text, gap, [limit], total)


def _read_regular(fd: int, size: int) -> StdinText:
    start = os.lseek(fd, 0, os.SEEK_CUR)
    size -= start
    if size <= HEAD_BYTES + TAIL_BYTES:
        data = _read_all(fd, size)
        return StdinText(data.decode("utf-8", errors="replace"), bytes_read=len(data))
    head = os.pread(fd, HEAD_BYTES, start)
    tail_at = start + size - TAIL_BYTES
    tail = os.pread(fd, TAIL_BYTES, tail_at)
    middle = size - len(head) - len(tail)
    lines = 0
    if middle <= READ_MAX:  # count the lines between them (reading, not keeping)
        pos = start + len(head)
        while pos < tail_at:
            b = os.pread(fd, min(1 << 20, tail_at - pos), pos)
            if not b:
                break
            lines += b.count(b"\n")
            pos += len(b)
    h, skipped, lines, t = _stitch(head, middle, lines, tail)
    out = _decode(h, skipped, lines, t, size)
    if middle > READ_MAX:
        out.gap = None
        out.limits[0] = (f"stdin of {_size(size)}: read {CAP_TEXT}; {_size(middle)} between them not "
                         f"read (line numbers after the gap count from it)")
    return out


def _read_all(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = os.read(fd, min(CHUNK * 16, n - got))
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def _wait(fd: int, timeout: float | None) -> bool:
    """True when ``fd`` is readable (or select cannot tell); False after ``timeout`` seconds."""
    try:
        r, _, _ = select.select([fd], [], [], timeout)
    except (OSError, ValueError):  # not selectable here: read blocking
        return True
    return bool(r)


def read_stdin_bounded(fd: int, tty: bool = False) -> StdinText:
    """Read ``fd`` within the bounds above (see the module docstring)."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return _read_regular(fd, st.st_size)
    keep = _Keeper()
    first = last = None
    why = None
    while True:
        timeout = None
        if first is not None and not tty:  # a person at a terminal ends with Ctrl-D
            now = time.monotonic()
            left_wait = WAIT_S - (now - first)
            left_quiet = QUIET_S - (now - last)
            timeout = min(left_wait, left_quiet)
            if timeout <= 0:
                why = "wait" if left_wait <= 0 else "quiet"
                break
        if not _wait(fd, timeout):
            continue  # the next turn sees the time out
        try:
            chunk = os.read(fd, CHUNK)
        except OSError:  # EIO from a terminal that went away: answer on what arrived
            chunk = b""
        if not chunk:
            break
        last = time.monotonic()
        if first is None:
            first = last
        keep.add(chunk)
        if keep.total >= READ_MAX:
            why = "max"
            break
    out = _decode(*keep.result(), keep.total)
    if why == "quiet":
        out.limits.append(f"stdin was still open after {QUIET_S:g} s without new input: answered on the "
                          f"{_size(keep.total)} that had arrived")
    elif why == "wait":
        out.limits.append(f"stdin kept coming for {WAIT_S:g} s: answered on the {_size(keep.total)} read so "
                          "far; for a running job, pipe its finished log (python train.py 2>&1 | tail -n 2000 "
                          "| torchdoctor ask -)")
    elif why == "max":
        out.limits.append(f"stdin passed {_size(READ_MAX)}: stopped reading there; for the end of a huge log, "
                          "torchdoctor ask - < train.log (reads its tail directly) or tail -n 2000 train.log | "
                          "torchdoctor ask -")
    return out
