"""The evidence contract between the child harness and the parent: a run directory.

Layout of a run dir ``D``::

    D/meta.json      written by the parent before launch: probe, argv, options
    D/events.jsonl   appended by the child while measuring, one JSON object a line:
                     {"kind": str, "t": seconds since harness start, "pid": int, ...data}
    D/result.json    written by the child when the script ends (any way it can still write)
    D/stacks.txt     faulthandler dumps (timeout / hang)
    D/<artifacts>    traces, snapshots

Every event line is flushed as it is written, so a crash or a SIGKILL keeps what was measured.
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


class EvidenceWriter:
    """Append-only JSONL writer used inside the child (cheap, flushed per line)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / EVENTS
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")
        self._t0 = time.perf_counter()
        self._pid = os.getpid()

    def write(self, kind: str, **data: Any) -> None:
        rec = {"kind": kind, "t": round(time.perf_counter() - self._t0, 6), "pid": self._pid}
        rec.update(data)
        self._f.write(json.dumps(rec, default=_default, allow_nan=True) + "\n")

    def close(self) -> None:
        try:
            self._f.close()
        except Exception:
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
