"""The evidence contract between the child harness and the parent: a run directory.

Layout of a run dir ``D``::

    D/meta.json      written by the parent before launch: probe, argv, options, needs
    D/events.jsonl   appended by the child while measuring, one JSON object a line:
                     {"kind": str, "t": seconds since harness start, "pid": int, ...data}
    D/result.json    written by the child when the script ends (any way it can still write)
    D/stacks.txt     faulthandler dumps (timeout / hang)
    D/<artifacts>    traces, snapshots

Event lines reach the disk within ``FLUSH_S`` (0.25 s) of being written, so a crash, a hang
or a SIGKILL keeps what was measured (a SIGKILL loses at most the last 0.25 s).
Instruments aggregate per step: at most a handful of events per step, never per op.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

META = "meta.json"
EVENTS = "events.jsonl"
RESULT = "result.json"
STACKS = "stacks.txt"


def _default(o: Any) -> Any:
    if isinstance(o, float):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


FLUSH_S = 0.25  # evidence reaches the disk at most this long after it is written


# one encoder for every event: json.dumps(..., default=...) builds a new one per call
_ENCODE = json.JSONEncoder(default=_default, allow_nan=True).encode


class EvidenceWriter:
    """Append-only JSONL writer used inside the child.

    ``write`` queues the line; the queue goes to disk when the last flush is older than
    ``FLUSH_S`` (checked on each write) and from a daemon thread every ``FLUSH_S``, so a
    hung script's last events are on disk before the timeout kill, and a SIGKILL loses at most
    the last ``FLUSH_S`` seconds. ``close`` flushes the rest. (A flushed write per event cost
    ≈ 100 µs of CPU per step on the 2-core box: 3% of a 3.5 ms step.) Forked DataLoader
    workers never flush (pid check): their copy of the queue is dropped.
    """

    def __init__(self, run_dir: str | os.PathLike, flush_s: float = FLUSH_S):
        import collections
        import threading

        self.path = Path(run_dir) / EVENTS
        self._f = open(self.path, "a", encoding="utf-8")
        self._t0 = time.perf_counter()
        self._pid = os.getpid()
        self._queue: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()
        self._flush_s = flush_s
        self._last = self._t0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="torchdoctor-evidence", daemon=True)
        self._thread.start()

    def write(self, kind: str, **data: Any) -> None:
        now = time.perf_counter()
        rec = {"kind": kind, "t": round(now - self._t0, 6), "pid": self._pid}
        rec.update(data)
        self._queue.append(_ENCODE(rec))
        if now - self._last >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        if os.getpid() != self._pid or self._closed and self._f.closed:
            return
        with self._lock:
            lines = []
            q = self._queue
            while q:
                try:
                    lines.append(q.popleft())
                except IndexError:
                    break
            self._last = time.perf_counter()
            if lines:
                self._f.write("\n".join(lines) + "\n")
                self._f.flush()

    def _run(self) -> None:
        while not self._closed:
            time.sleep(self._flush_s)
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - never let the flusher die loudly
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self.flush()
            self._f.close()
        except Exception:  # noqa: BLE001
            pass


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write JSON atomically (tmp + rename) so a reader never sees half a file."""
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(data, default=_default, indent=1))
    os.replace(tmp, p)


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_events(run_dir: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Events in write order; a torn last line (killed mid-write) is skipped."""
    p = Path(run_dir) / EVENTS
    if not p.exists():
        return
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue
