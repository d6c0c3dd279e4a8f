"""Parse ``faulthandler`` dumps (``stacks.txt``) into threads and frames.

Format (CPython 3.10-3.13)::

    Thread 0x00007f1c (most recent call first):
      File "/path/train.py", line 12 in wait
    Current thread 0x00007f2d (most recent call first):
      File "/path/train.py", line 30 in <module>

A dump may be written more than once (timeout, then a fatal signal); the last one wins.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)(?: \[(.*?)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_FATAL = re.compile(r"^Fatal Python error: (.*)$")


def parse_stacks(text: str) -> dict[str, Any]:
    """{'threads': [{'id', 'name', 'current', 'frames': [[file, line, func], ...]}], 'fatal'}.

    Frames are innermost first, as faulthandler writes them. Only the last dump is kept.
    """
    dumps: list[list[dict[str, Any]]] = []
    threads: list[dict[str, Any]] = []
    seen: set[str] = set()
    fatal = None
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if m.group(2) in seen:  # the same thread again: a later dump starts
                dumps.append(threads)
                threads, seen = [], set()
            seen.add(m.group(2))
            cur = {"id": m.group(2), "name": m.group(3), "current": m.group(1) == "Current thread",
                   "frames": []}
            threads.append(cur)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur["frames"].append([m.group(1), int(m.group(2)), m.group(3)])
            continue
        m = _FATAL.match(line)
        if m:
            fatal = m.group(1)
            if threads:
                dumps.append(threads)
            threads, seen, cur = [], set(), None
    if threads:
        dumps.append(threads)
    return {"threads": dumps[-1] if dumps else [], "fatal": fatal}


def main_thread(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The thread running the script: the one whose outermost frames are the harness's."""
    for t in threads:
        if any(f[0].endswith(("runner/harness.py", "runner\\harness.py")) for f in t["frames"]):
            return t
    return next((t for t in threads if t["current"]), threads[0] if threads else None)


def read_stacks(path: str | Path) -> dict[str, Any]:
    try:
        return parse_stacks(Path(path).read_text(errors="replace"))
    except OSError:
        return {"threads": [], "fatal": None}
