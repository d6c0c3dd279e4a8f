"""Every process a run started, found and ended: by session, by parent tree, by adoption.

A script may leave its child's process group (``os.setpgrp()``, ``Popen(process_group=0)``),
or even its session (``setsid``, torchrun's ranks), and a finished rank's subprocess outlives
it. :class:`Tracker` follows the run's processes from the parent side (Linux, ``/proc``):

* every process whose **session** is a tracked session (the child's, made by
  ``start_new_session=True``, and any session led by a tracked process: torchrun's ranks);
* every **descendant** of a tracked process, by the parent-pid tree, snapshotted while the run
  lives (``snapshot()``, about once a second: an orphan is re-parented and leaves the tree);
* with :func:`become_subreaper`, orphans of the run are re-parented to torchdoctor itself
  instead of init, so those started after the run began are found as our own children;
* at the end, every process whose environment carries the run's marker
  (``TORCHDOCTOR_RUN_ID=<token>``, inherited by whatever the script starts unless it clears its
  environment): an orphan that left the session between two snapshots is still found.

``kill_all()`` SIGKILLs all of them (a process is matched by pid *and* start time, so a
recycled pid is never hit) until none is left, and reaps the ones that became our children.
Never imports torch; without ``/proc`` (not Linux) it falls back to the child's process group.
"""

from __future__ import annotations

import os
import signal
import time
from typing import NamedTuple

PROC = "/proc"
RUN_ID_ENV = "TORCHDOCTOR_RUN_ID"  # set in the child's environment: marks the run's processes


class Stat(NamedTuple):
    pid: int
    state: str
    ppid: int
    pgrp: int
    sid: int
    start: int  # start time in clock ticks since boot: (pid, start) names one process


def read_stat(pid: int) -> Stat | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = raw.rsplit(")", 1)[-1].split()
    try:
        return Stat(pid, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def all_stats() -> dict[int, Stat]:
    out = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[st.pid] = st
    return out


def has_proc() -> bool:
    return os.path.isdir(f"{PROC}/self")


def become_subreaper(on: bool = True) -> bool:
    """Linux: orphans of our descendants are re-parented to us (PR_SET_CHILD_SUBREAPER)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1 if on else 0, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER = 36
    except Exception:  # noqa: BLE001 - best effort
        return False


def _environ(pid: int) -> list[bytes]:
    """The process's environment entries (empty when it is gone or not ours to read)."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        st = read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


class Tracker:
    """The processes of one run (see the module docstring). ``root``: the child's pid."""

    def __init__(self, root: int, adopt_after: float | None = None, marker: str | None = None):
        self.root = root
        self.marker = f"{RUN_ID_ENV}={marker}".encode() if marker else None
        self.sessions: set[int] = {root}  # started with start_new_session=True
        self.seen: dict[int, int] = {}  # pid -> start ticks
        self.me = os.getpid()
        self.my_sid = os.getsid(0)
        self.keep = _ancestors()  # never ourselves or whoever started us
        root_stat = read_stat(root)
        self.root_start = root_stat.start if root_stat else None
        self.adopt = adopt_after is not None and root_stat is not None
        if root_stat is not None:
            self.seen[root] = root_stat.start
        self.last_snapshot = 0.0

    def _ours(self, entries: list[bytes]) -> bool:
        # the run's token, or a process's narrowed one below it ("<token>.<pid>", lifeline)
        sub = self.marker + b"."
        return any(e == self.marker or e.startswith(sub) for e in entries)

    def _marked(self, pid: int) -> bool:
        return self._ours(_environ(pid))

    def _foreign(self, pid: int) -> bool:
        """The process carries another run's marker (a run this process started beside ours)."""
        entries = _environ(pid)
        key = f"{RUN_ID_ENV}=".encode()
        return any(e.startswith(key) for e in entries) and not self._ours(entries)

    def _adopted(self, st: Stat) -> bool:
        """An orphan of the run re-parented to us (subreaper): our child, started after the run,
        that left our session (a child we started ourselves without a session of its own, such
        as another torchdoctor run or a helper of the program hosting us, stays in it) and that
        carries no other run's marker (a run we started beside this one)."""
        return (self.adopt and st.ppid == self.me and self.root_start is not None
                and st.start >= self.root_start and st.sid != self.my_sid
                and not (self.marker is not None and self._foreign(st.pid)))

    def _members(self, stats: dict[int, Stat], by_marker: bool = False) -> dict[int, Stat]:
        """Processes of the run now: tracked sessions, tracked pids, their descendants (and,
        ``by_marker``, every process whose environment carries the run's marker)."""
        found: dict[int, Stat] = {}
        by_marker = by_marker and self.marker is not None
        for st in stats.values():
            if st.pid in self.keep:
                continue
            if (st.sid in self.sessions or self.seen.get(st.pid) == st.start
                    or (by_marker and st.state not in ("Z", "X") and self._marked(st.pid))
                    or self._adopted(st)):
                found[st.pid] = st
        children: dict[int, list[Stat]] = {}
        for st in stats.values():
            children.setdefault(st.ppid, []).append(st)
        todo = list(found)
        while todo:
            for c in children.get(todo.pop(), []):
                if c.pid not in found and c.pid not in self.keep:
                    found[c.pid] = c
                    todo.append(c.pid)
        return found

    def snapshot(self) -> None:
        """Remember the run's processes and the sessions its processes lead."""
        if not has_proc():
            return
        self.last_snapshot = time.monotonic()
        for st in self._members(all_stats()).values():
            self.seen[st.pid] = st.start
            if st.sid == st.pid:  # a session leader of the run (a rank, a setsid'd helper)
                self.sessions.add(st.sid)

    def maybe_snapshot(self, every_s: float = 1.0) -> None:
        if time.monotonic() - self.last_snapshot >= every_s:
            self.snapshot()

    def alive(self) -> list[int]:
        """Pids of the run still alive (zombies are dead)."""
        if not has_proc():
            return []
        return [p for p, st in self._members(all_stats()).items() if st.state not in ("Z", "X")]

    def kill_all(self, wait_s: float = 3.0, group: bool = True) -> list[int]:
        """SIGKILL every process of the run until none is left; returns the pids still alive.

        ``group``: first ``killpg`` the root's process group (the whole of it in one call)."""
        if group:
            try:
                os.killpg(self.root, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        if not has_proc():
            return []
        deadline = time.monotonic() + wait_s
        first = True
        while True:
            stats = all_stats()
            members = self._members(stats, by_marker=first)
            first = False
            for st in members.values():
                self.seen[st.pid] = st.start
                if st.sid == st.pid:
                    self.sessions.add(st.sid)
            live = [st for st in members.values() if st.state not in ("Z", "X")]
            for st in live:
                try:
                    os.kill(st.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._reap(members)
            if not live or time.monotonic() > deadline:
                return [st.pid for st in live] if live else []
            time.sleep(0.02)

    def _reap(self, members: dict[int, Stat]) -> None:
        """Collect the exit status of adopted orphans (our children, not the Popen'd child)."""
        for st in members.values():
            if st.ppid == self.me and st.pid != self.root:
                try:
                    os.waitpid(st.pid, os.WNOHANG)
                except (ChildProcessError, OSError):
                    pass
