"""Which tests start a Python process: the line between ``make test-fast`` and the ``slow`` lane.

A test that starts a Python process pays its interpreter and, if the process imports torch,
~3-6 s of CPU on the 2-core CI box (docs/testing.md): that is what makes a test slow here, not
its own code. This plugin watches process starts (``subprocess``'s fork-exec and posix_spawn,
``os.fork``) from the test's own threads — the background fixture lanes (``fixture-lane-*``)
are not the running test's — and:

* ``TD_SPAWN_LOG=FILE``: writes one line per test that started a Python process or whose
  children used CPU: node id, how many Python processes, wall seconds, the first three program
  names, and the CPU seconds (user+system) of the test's own children — the
  ``getrusage(RUSAGE_CHILDREN)`` growth over the test less what the background lanes reaped
  meanwhile (their ``waitpid`` goes through ``wait4``, which gives each reaped child's usage).
  Sorting that column says which tests cost the suite's CPU (docs/testing.md);
* ``TD_SPAWN_STRICT=1`` (``make test-fast``): fails a test outside the ``slow`` lane that starts
  one and takes ``SLOW_S`` or more, saying how to mark it, so the fast lane stays fast as tests are
  added (``torchdoctor --help`` in a child, which imports no torch, costs ~0.3 s and may stay).

Starting a non-Python program (``sleep``, ``sh -c true``) is not counted: it costs milliseconds.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SLOW_LIST = Path(__file__).resolve().parent / "slow_tests.txt"
LANE_PREFIX = "fixture-lane-"
SLOW_S = 1.0  # a test that starts Python processes and takes this long belongs to the slow lane

_state = {"node": None, "count": 0, "what": [], "t0": 0.0, "cpu0": 0.0, "lane0": 0.0}
_lane_cpu = [0.0]  # CPU seconds of the children the background lanes reaped, in all


def _counted_thread() -> bool:
    return not threading.current_thread().name.startswith(LANE_PREFIX)


def _is_python(argv0) -> bool:
    if isinstance(argv0, bytes):
        argv0 = os.fsdecode(argv0)
    name = os.path.basename(str(argv0 or ""))
    return "python" in name or name in ("torchrun", "torchdoctor") or str(argv0) == sys.executable


def _note(argv0) -> None:
    if _state["node"] is not None and _counted_thread() and _is_python(argv0):
        _state["count"] += 1
        if len(_state["what"]) < 3:
            _state["what"].append(os.path.basename(os.fsdecode(argv0) if isinstance(argv0, bytes)
                                                   else str(argv0)))


def _wrap_fork_exec(real):
    def fork_exec(args, *rest, **kw):
        _note(args[0] if args else None)
        return real(args, *rest, **kw)
    return fork_exec


def _wrap_spawn(real):
    def spawn(path, argv, *rest, **kw):
        _note(argv[0] if argv else path)
        return real(path, argv, *rest, **kw)
    return spawn


def _wrap_fork(real):
    def fork():
        _note(sys.executable)
        return real()
    return fork


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _wrap_waitpid(real):
    def waitpid(pid, options):
        if _counted_thread() or not hasattr(os, "wait4"):
            return real(pid, options)
        got, status, ru = os.wait4(pid, options)  # a lane's reap: keep its children's CPU apart
        if got:
            _lane_cpu[0] += ru.ru_utime + ru.ru_stime
        return got, status
    return waitpid


def install() -> None:
    if getattr(subprocess, "_fork_exec", None) is not None:
        subprocess._fork_exec = _wrap_fork_exec(subprocess._fork_exec)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _wrap_spawn(getattr(os, name)))
    os.fork = _wrap_fork(os.fork)
    os.waitpid = _wrap_waitpid(os.waitpid)


def slow_nodes() -> set[str]:
    """Node ids (or file::prefix) listed in tests/slow_tests.txt, comments and blanks left out."""
    if not SLOW_LIST.exists():
        return set()
    out = set()
    for line in SLOW_LIST.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(line)
    return out


def listed_slow(nodeid: str, listed: set[str]) -> bool:
    """A test is listed by its node id, by its id without parameters, or by its file."""
    base = nodeid.split("[", 1)[0]
    return nodeid in listed or base in listed or nodeid.split("::", 1)[0] in listed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _state.update(node=item.nodeid, count=0, what=[], t0=time.monotonic(),
                  cpu0=_children_cpu(), lane0=_lane_cpu[0])
    yield
    cpu = (_children_cpu() - _state["cpu0"]) - (_lane_cpu[0] - _state["lane0"])
    path = os.environ.get("TD_SPAWN_LOG")
    if path and (_state["count"] or cpu >= 0.05):  # written as it goes: a stopped run keeps its lines
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{item.nodeid}\t{_state['count']}\t{time.monotonic() - _state['t0']:.1f}\t"
                    f"{','.join(_state['what'])}\t{max(cpu, 0.0):.2f}\n")
    _state["node"] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    took = time.monotonic() - _state["t0"]
    if (call.when == "teardown" and rep.passed and _state["count"] and took >= SLOW_S
            and os.environ.get("TD_SPAWN_STRICT") and item.get_closest_marker("slow") is None):
        rep.outcome = "failed"
        rep.longrepr = (f"{item.nodeid} started {_state['count']} Python process(es) "
                        f"({', '.join(_state['what'])}) and took {took:.1f} s outside the slow lane: a "
                        "process importing torch costs seconds of CPU here. Mark the test "
                        "@pytest.mark.slow or list it in tests/slow_tests.txt (docs/testing.md, "
                        "'The fast lane').")

