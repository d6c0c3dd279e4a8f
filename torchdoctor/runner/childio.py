"""The parent's view of the child's output and progress (part of :mod:`torchdoctor.runner.launch`):

* :class:`_Progress` reads new ``step`` events from events.jsonl and draws "step i/N" on a
  terminal's stderr (a plain line every ``PLAIN_EVERY_S`` without one);
* :class:`_Pump` tees the child's stdout/stderr to ours as it comes (partial lines held
  ``HOLD_S``), dropping the lines of the ``quiet`` patterns (Kineto's own noise);
* :class:`_Tail` keeps the last ``TAIL_LINES`` lines for the report.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# output lines of libraries that are not the script's (Kineto's profiler start/stop notes)
QUIET_PATTERNS: list[str] = [r"^STAGE:\d{4}-\d\d-\d\d .*ActivityProfilerController\.cpp"]

STOP_GRACE_MIN_S = 2.0  # a progressing run's clean stop after --timeout: at least this long
TAIL_LINES = 40
TAIL_LINE_MAX = 2000  # characters kept of each tail line (its end)
CHUNK = 65536  # bytes read from the child's output at a time
HOLD_S = 0.05  # a partial line (progress bar, prompt) is written after this long without output
HOLD_MAX = 65536  # ... or at once when it grows past this many bytes
PLAIN_EVERY_S = 5.0  # without a terminal: a plain progress line this often


class _Progress:
    """Reads new step events from events.jsonl; draws 'step i/N' on a terminal's stderr."""

    def __init__(self, path: Path, total: int | None, on_event: Callable[[dict], None] | None,
                 show: bool, lock: threading.Lock, plain: bool = False):
        self.path, self.total, self.on_event, self.show, self.lock = path, total, on_event, show, lock
        self.plain = plain  # not a terminal: a plain line every PLAIN_EVERY_S instead
        self.t0 = time.monotonic()
        self.last_plain = self.t0
        self.midline = False  # the script's output ends mid-line: do not draw over it
        self.pos = 0
        self.steps = 0
        self.last_seen: float | None = None  # monotonic time the newest step event was read
        self.step_interval: float | None = None  # seconds per step, from the events' own clock
        self._first: tuple[int, float] | None = None
        self.buf = b""
        self.drawn = False

    def poll(self) -> None:
        self._read()
        if self.plain and time.monotonic() - self.last_plain >= PLAIN_EVERY_S:
            self.print_plain()

    def print_plain(self) -> None:
        self.last_plain = now = time.monotonic()
        total = f"/{self.total}" if self.total else ""
        with self.lock:
            try:
                sys.stderr.write(f"{chr(10) if self.midline else ''}[torchdoctor] step "
                                 f"{self.steps}{total}, {now - self.t0:.0f} s elapsed\n")
                sys.stderr.flush()
                self.midline = False
            except (OSError, ValueError):
                pass

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return
        if not chunk:
            return
        self.pos += len(chunk)
        data = self.buf + chunk
        lines = data.split(b"\n")
        self.buf = lines.pop()
        changed = False
        if self.on_event is None:  # progress needs only the newest step: parse that line alone
            last = next((ln for ln in reversed(lines) if b'"kind": "step"' in ln), None)
            lines = [last] if last is not None else []
        for line in lines:
            if b'"kind": "step"' not in line and self.on_event is None:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("kind") == "step":
                self.steps = int(ev.get("step", self.steps))
                self._note_step(self.steps, float(ev.get("t", 0.0)))
                changed = True
            if self.on_event is not None:
                self.on_event(ev)
        if changed and self.show:
            self.draw()

    def _note_step(self, step: int, t: float) -> None:
        self.last_seen = time.monotonic()
        if self._first is None:
            self._first = (step, t)
            self.step_interval = t / max(step, 1)
        elif step > self._first[0]:
            self.step_interval = (t - self._first[1]) / (step - self._first[0])

    def progressing(self, now: float) -> bool:
        """Steps still come: the newest was read within two step intervals (+ the 0.25 s flush)."""
        if self.last_seen is None or self.step_interval is None:
            return False
        return now - self.last_seen <= max(STOP_GRACE_MIN_S, 2 * self.step_interval) + 0.5

    def draw(self) -> None:
        total = f"/{self.total}" if self.total else ""
        with self.lock:
            if self.midline:
                return
            try:
                sys.stderr.write(f"\r\x1b[K[torchdoctor] step {self.steps}{total}")
                sys.stderr.flush()
                self.drawn = True
            except (OSError, ValueError):
                pass

    def clear(self) -> None:
        """Erase the progress line (called with the lock held)."""
        if self.drawn:
            try:
                sys.stderr.write("\r\x1b[K")
            except (OSError, ValueError):
                pass
            self.drawn = False


class _Tail:
    """The last ``TAIL_LINES`` lines of output, each cut to its last ``TAIL_LINE_MAX`` chars.

    A terminal's view: ``\r`` (a progress bar's redraw) starts the current line over."""

    def __init__(self) -> None:
        self.lines: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.cur = ""
        self.cr = False

    def feed(self, text: str, end: bytes) -> None:
        if text:
            if self.cr:
                self.cur, self.cr = "", False
            self.cur = (self.cur + text)[-TAIL_LINE_MAX:]
        if end == b"\r":
            self.cr = True
        elif end:
            self.lines.append(self.cur)
            self.cur, self.cr = "", False

    def snapshot(self) -> list[str]:
        return list(self.lines) + ([self.cur] if self.cur else [])


_SEGMENT = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")


class _Pump:
    """Copies the child's output to our stderr as it comes, in bounded pieces.

    Whole lines are checked against ``quiet`` and written; a partial line (a ``\r`` progress
    bar, a print without newline) is written after ``HOLD_S`` without more output, or at once
    past ``HOLD_MAX`` bytes, so memory stays bounded whatever the script writes and progress
    bars show as they are drawn. A write error (terminal gone) stops the copy, not the reading.
    """

    def __init__(self, pipe, quiet: list[re.Pattern], tail: _Tail, lock: threading.Lock,
                 progress: _Progress | None):
        self.pipe, self.quiet, self.tail, self.lock, self.progress = pipe, quiet, tail, lock, progress
        self.out = getattr(sys.stderr, "buffer", None)
        self.pending = b""
        self.midline = False  # part of the current line was written: the rest is not filtered
        self.broken = False

    def run(self) -> None:
        fd = self.pipe.fileno()
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], HOLD_S)
                if not ready:
                    self._flush_partial()
                    continue
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                self._feed(chunk)
            self._flush_partial(final=True)
        except (OSError, ValueError):
            pass
        finally:
            try:
                self.pipe.close()
            except OSError:
                pass

    def _feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        pos = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1  # the complete segments end here
        for m in _SEGMENT.finditer(data, 0, pos):
            seg = m.group(0)
            body = seg.rstrip(b"\r\n")
            end = seg[len(body):]
            if end == b"\r\n":
                end = b"\n"
            text = body.decode("utf-8", errors="replace")
            if not self.midline and self.quiet and any(p.search(text) for p in self.quiet):
                continue
            self._write(seg, text, end)
            self.midline = False
        self.pending = data[pos:]
        if len(self.pending) > HOLD_MAX:
            self._flush_partial(final=True)

    def _flush_partial(self, final: bool = False) -> None:
        if not self.pending:
            return
        text = self.pending.decode("utf-8", errors="replace")
        if not final and not self.midline and self.quiet and any(p.search(text) for p in self.quiet):
            return  # may be a line we drop: wait for its end
        self._write(self.pending, text, b"")
        self.pending = b""
        self.midline = True

    def _write(self, raw: bytes, text: str, end: bytes) -> None:
        self.tail.feed(text, end)
        with self.lock:
            if self.progress is not None:
                self.progress.clear()
                self.progress.midline = end != b"\n"
            if self.broken:
                return
            try:
                if self.out is not None:
                    self.out.write(raw)
                    self.out.flush()
                else:
                    sys.stderr.write(raw.decode("utf-8", errors="replace"))
                    sys.stderr.flush()
            except (OSError, ValueError):
                self.broken = True
