"""The child's lifeline to torchdoctor: die with the parent, and keep the deadline without it.

If torchdoctor is killed (SIGKILL, a crashed terminal, the OOM killer) it can neither forward
a signal nor kill anything, so every process it launches binds itself at boot:

* :func:`bind` (first thing in the child harness, and in every rank): Linux
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this process when its parent dies;
  a parent already gone before the call (the race) is caught by checking the parent pid after.
* :func:`watch` (a daemon thread, every 0.5 s): the parent-pid fallback (the parent changed,
  or torchdoctor's pid is gone; for systems without ``prctl``) and the run's own deadline
  (``--timeout`` plus the parent's grace, :data:`DEADLINE_MARGIN_S`): past it the child dumps
  every thread's stack to ``stacks.txt``, kills its own session and descendants and itself,
  so no run outlives its bound even if the parent is stuck or stopped.
* :func:`bound_command` wraps a launcher (torchrun) the same way: a tiny boot sets
  PDEATHSIG and ``exec``s the real command (the setting survives ``execve``).

Never imports torch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
# past --timeout the parent may still be stopping the run: up to 15 s of clean-stop grace,
# 1-4 s of stack dumps, then the kill; the child's own deadline comes after all of that
DEADLINE_MARGIN_S = 30.0
WATCH_EVERY_S = 0.5
EXIT_ORPHANED = 129  # the exit status of a child whose parent vanished before it could bind

_state: dict = {"parent": None, "launcher": None}

# python -c BOOT LAUNCHER_PID CMD...: die with the parent, then exec CMD (no torchdoctor import)
EXEC_BOOT = ("import ctypes, os, sys\n"
             "try:\n"
             "    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
             "except Exception:\n"
             "    pass\n"
             "p = int(sys.argv[1])\n"
             "if os.getppid() != p:\n"
             "    os._exit(129)\n"
             "os.execv(sys.argv[2], sys.argv[2:])\n")


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux: the watch thread is the fallback
        return False


def _alive(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def bind(launcher_pid: int | None) -> None:
    """Die with our parent; exit at once if torchdoctor (``launcher_pid``) is already gone."""
    set_pdeathsig()
    _state["parent"] = os.getppid()
    _state["launcher"] = launcher_pid
    if _state["parent"] == 1 or not _alive(launcher_pid):
        os._exit(EXIT_ORPHANED)


def narrow_marker() -> None:
    """Mark what this process starts as its own: ``<run token>.<pid>`` (the parent still finds
    it by the token; this process's guard kills only its own, not another rank's)."""
    from torchdoctor.runner.reap import RUN_ID_ENV

    token = os.environ.get(RUN_ID_ENV)
    if token:
        os.environ[RUN_ID_ENV] = f"{token}.{os.getpid()}"


def start_guard() -> int | None:
    """Start a guard that outlives this process by a moment: when this process dies (killed
    with its parent by PDEATHSIG, or any other way), it kills what the run left (this
    process's session, the sessions its processes lead, their descendants, every process
    with this process's marker), then exits.

    Forked at boot, before torch is imported (a small copy), twice: the guard is not a child of
    the script's process (a script that waits for "any child" never meets it); torchdoctor, a
    child subreaper, adopts it. It checks this process every 0.2 s and snapshots the run's
    processes once a second (≈ 4 ms of CPU). Returns True when it was started.
    """
    from torchdoctor.runner.reap import read_stat

    me = read_stat(os.getpid())
    if me is None:
        return None
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        try:
            os.waitpid(pid, 0)  # the intermediate exits at once
        except ChildProcessError:
            pass
        return True
    code = 0
    try:
        if os.fork():
            os._exit(0)
        _guard(me.pid, me.start)
    except BaseException:  # noqa: BLE001 - the guard never raises into anything
        code = 1
    finally:
        os._exit(code)


def _guard(child: int, start: int) -> None:
    from torchdoctor.runner.reap import RUN_ID_ENV, Tracker, read_stat

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        try:
            signal.signal(s, signal.SIG_IGN)  # only the end of the run ends the guard
        except (OSError, ValueError):
            pass
    tracker = Tracker(child, marker=os.environ.get(RUN_ID_ENV))
    tracker.keep = {os.getpid()}  # everything of the run but the guard itself
    while True:
        st = read_stat(child)
        if st is None or st.start != start or st.state in ("Z", "X"):
            break
        time.sleep(0.2)
        tracker.maybe_snapshot(1.0)
    tracker.kill_all(wait_s=2.0, group=False)


def bound_command(cmd: list[str], launcher_pid: int | None = None) -> list[str]:
    """``cmd`` (an executable path first) started through a boot that dies with its parent."""
    return [sys.executable, "-c", EXEC_BOOT, str(launcher_pid or os.getpid()), *cmd]


def deadline_of(meta: dict) -> float | None:
    """Wall-clock time (time.time()) after which the run must be gone, from meta.json."""
    timeout = (meta.get("options") or {}).get("timeout")
    started = meta.get("started")
    try:
        if timeout and started:
            return float(started) + float(timeout) + DEADLINE_MARGIN_S
    except (TypeError, ValueError):
        pass
    return None


def watch(deadline: float | None, stacks_file=None) -> threading.Thread:
    """Start the watch thread (see the module docstring)."""
    t = threading.Thread(target=_watch, args=(deadline, stacks_file), daemon=True,
                         name="torchdoctor-lifeline")
    t.start()
    return t


def _watch(deadline: float | None, stacks_file) -> None:
    me = os.getpid()
    while True:
        time.sleep(WATCH_EVERY_S)
        if os.getpid() != me:  # a forked copy (DataLoader worker): the thread is not running there
            return
        parent = _state["parent"]
        if parent is not None and (os.getppid() != parent or not _alive(_state["launcher"])):
            stop_now("torchdoctor (the parent process) is gone", stacks_file)
        if deadline is not None and time.time() > deadline:
            stop_now(f"the run is {DEADLINE_MARGIN_S:g} s past its --timeout and was not stopped",
                     stacks_file)


def stop_now(why: str, stacks_file=None) -> None:
    """Write the stacks, kill this process's session and descendants, then itself."""
    try:
        sys.stderr.write(f"\n[torchdoctor] {why}: stopping the script\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - the pipe may be gone with the parent
        pass
    if stacks_file is not None:
        try:
            import faulthandler

            faulthandler.dump_traceback(file=stacks_file, all_threads=True)
        except Exception:  # noqa: BLE001
            pass
    try:
        from torchdoctor.runner.reap import RUN_ID_ENV, Tracker

        # keeps ourselves and our ancestors: the others go first
        tr = Tracker(os.getpid(), marker=os.environ.get(RUN_ID_ENV))
        if os.getsid(0) != os.getpid():  # not a session of our own: never the caller's session
            tr.sessions.clear()
        tr.kill_all(wait_s=1.0, group=False)
    except Exception:  # noqa: BLE001
        pass
    os.kill(os.getpid(), signal.SIGKILL)
