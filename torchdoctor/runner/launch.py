"""The parent side of a run: spawn the child harness, stream its output, enforce the timeout.

* The child runs in a new session and binds itself to us at boot (:mod:`.lifeline`: it dies
  with torchdoctor and keeps the --timeout deadline itself). Everything the run starts is
  tracked by :class:`.reap.Tracker` (the child's session, the ranks' sessions, the parent-pid
  tree, orphans adopted as a child subreaper) and killed when the run ends, however it ends.
* Timeout: SIGUSR1 first (the child's ``faulthandler`` writes every thread's stack to
  ``stacks.txt``), ~1 s to write it, then SIGKILL to all of the run.
* Stop signals (:mod:`.signals`): Ctrl-C, SIGTERM and SIGHUP are forwarded to the child as
  SIGINT (``KeyboardInterrupt`` in the script), which writes its evidence; a second signal,
  or ``INTERRUPT_GRACE_S`` without exit, kills the run; the report says ``interrupted``.
* The script's stdout and stderr are merged and streamed to our stderr as they come, in
  bounded pieces (:class:`_Pump`; stdout is for the report); whole lines matching
  ``quiet_patterns`` are dropped; a bounded tail is kept as evidence. stdin is passed through.
* Progress: new ``step`` events are read from ``events.jsonl`` while the child runs; drawn
  on a terminal, a plain line every ``PLAIN_EVERY_S`` otherwise (CI logs, ``| tee``).

Never imports torch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from torchdoctor.runner import fileguard, lifeline, privtmp, reap, signals
from torchdoctor.runner.childio import (  # noqa: F401 - TAIL_LINE_MAX, _Tail re-exported
    STOP_GRACE_MIN_S, TAIL_LINE_MAX, _Progress, _Pump, _Tail)
from torchdoctor.runner.rundir import EVENTS, META, RESULT, read_json, write_json

STACK_DUMP_WAIT_S = 1.0
STOP_GRACE_MAX_S = 15.0  # a progressing run's clean stop after --timeout (at least STOP_GRACE_MIN_S)
INTERRUPT_GRACE_S = 5.0  # after a stop signal (Ctrl-C, SIGTERM, SIGHUP) the child gets this long
EXIT_GRACE_S = 15.0  # after result.json is written, the script gets this long to exit
# the parent's wake-up period while the child runs: 20 ms cost the child ~2-3% of its step on
# the 2-core box (bench/overhead.py cpu_mlp, 9 rounds: 1.024x vs 0.996x at 0.5 s); 0.1 s keeps
# exit, timeout and Ctrl-C handling within a tenth of a second
POLL_S = 0.1
_PKG_ROOT = str(Path(__file__).resolve().parents[2])
# python -c BOOT PKG_ROOT LAUNCHER_PID RUN_DIR: bind to the parent first, then the harness
_BOOT = ("import sys; sys.path.append(sys.argv.pop(1)); "
         "from torchdoctor.runner import lifeline; lifeline.bind(int(sys.argv.pop(1))); "
         "lifeline.narrow_marker(); lifeline.start_guard(); "
         "from torchdoctor.runner.harness import main; sys.exit(main(sys.argv[1:]))")


@dataclass
class LaunchResult:
    outcome: str  # exit | stopped | crash | interrupted | timeout | signal
    returncode: int | None
    wall_s: float
    result: dict[str, Any] = field(default_factory=dict)
    output_tail: list[str] = field(default_factory=list)


def launch(run_dir: str | os.PathLike, probe: str, argv: list[str], *, module: bool = False,
           options: Any = None, timeout: float | None = None,
           quiet_patterns: list[str] | None = None, show_progress: bool | None = None,
           on_event: Callable[[dict], None] | None = None,
           env: dict[str, str] | None = None, ranks: Any = None,
           needs: Iterable[str] | None = None, echo: bool = True) -> LaunchResult:
    """Run ``argv`` (script + args, or module + args) under the harness; blocks until done.

    Writes ``meta.json`` first and the final ``result.json`` last (the child's result plus
    what only the parent knows: timeout, signal, return code, wall time, output tail).
    ``options``: a :class:`torchdoctor.pipeline.options.RunOptions` (serialised here by its
    ``wire()``: the child's ``ctx.options``, the same names) or that mapping itself.
    ``ranks`` (a :class:`torchdoctor.distributed.torchrun.RankSet`): run the harness on every rank
    under torchrun, one run dir per rank; timeout, Ctrl-C and clean-up go to every rank.
    ``needs``: the evidence kinds to arm instruments for (the caller's
    ``torchdoctor.pipeline.registry.armed_needs(probe)``; none: the script runs unmeasured).
    ``echo=False``: the script's output is not copied to our stderr (the trials layer's repeated
    runs); its tail is still kept as evidence. Raises :class:`.signals.Stopped` without starting
    anything once a stop signal was recorded in the enclosing :func:`.signals.deferred` scope.
    """
    signals.check()  # a stop signal already arrived (deferred scope): no further run starts
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    options = options.wire() if hasattr(options, "wire") else dict(options or {})
    write_json(d / META, {"probe": probe, "argv": list(argv), "module": bool(module),
                          "options": options, "cwd": os.getcwd(), "started": time.time(),
                          "needs": sorted(needs or ())})
    child_env = dict(os.environ)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["TORCHDOCTOR_RUN_DIR"] = str(d)
    run_id = child_env[reap.RUN_ID_ENV] = uuid.uuid4().hex  # marks every process of this run
    if env:
        child_env.update(env)
    tmp = privtmp.make(d)  # torch's temporaries (pymp-*, torchinductor_*, cc*.s) go with the run
    child_env[privtmp.ENV] = str(tmp)
    cmd = [sys.executable, "-c", _BOOT, _PKG_ROOT, str(os.getpid()), str(d)]
    if ranks is not None:
        cmd, child_env = lifeline.bound_command(ranks.command(cmd)), ranks.env(child_env)
    lock = threading.Lock()
    if show_progress is None:
        tty = _isatty(sys.stderr)
        show_progress, plain = tty, not tty
    else:
        plain = False
    steps = options.get("steps")
    progress = _Progress(ranks.events_path() if ranks is not None else d / EVENTS,
                         int(steps) if steps else None, on_event, show_progress, lock, plain)
    tail = _Tail()
    quiet = [re.compile(p) for p in (quiet_patterns or [])]

    with signals.catching() as pending:
        reap.become_subreaper()
        t0 = time.monotonic()
        # stdin is passed through, as `python script.py` would (a pipe, a terminal, a file)
        proc = subprocess.Popen(cmd, stdin=None, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        tracker = reap.Tracker(proc.pid, adopt_after=t0, marker=run_id)
        if ranks is not None:
            ranks.started(proc.pid)
        copier = _Pump(proc.stdout, quiet, tail, lock, progress)
        copier.broken = not echo  # not copied, still read (the tail is kept)
        pump = threading.Thread(target=copier.run, daemon=True, name="torchdoctor-output")
        pump.start()
        state = _Loop(proc, d, ranks, progress, tracker, timeout, t0)
        try:
            state.run(pending)
        finally:
            wall = time.monotonic() - t0
            # whatever the run left behind: its process group and session, the ranks' sessions,
            # subprocesses that moved to a group or session of their own, adopted orphans
            if ranks is not None:
                ranks.kill()
            left = tracker.kill_all()
            reap.become_subreaper(False)
            privtmp.remove(tmp)
            restored = fileguard.restore(d) if options.get("guard_files") else None
    pump.join(timeout=3.0)
    progress.poll()
    with lock:
        progress.clear()
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    result = read_json(d / RESULT) or {}
    rc = proc.returncode
    if state.timed_out:
        result = {**result, "outcome": "timeout", "timeout_s": timeout,
                  "child_outcome": result.get("outcome")}
    elif state.interrupted and (not result or result.get("outcome") in (None, "exit", "stopped")):
        # the run ended because we stopped it: whatever the script did with the SIGINT
        result = {**result, "outcome": "interrupted", "child_outcome": result.get("outcome")}
    elif not result or "outcome" not in result:
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            result = {**result, "outcome": "signal", "signal": name, "signum": -rc}
        else:  # os._exit() or a harness failure before result.json
            result = {**result, "outcome": "exit", "exit_code": rc, "no_result": True}
    if state.soft_stop_at is not None:
        result["clean_stop_requested"] = True
        result["clean_stop_grace_s"] = round(state.soft_grace, 2)
        if not state.timed_out:
            result["stopped_by_timeout"] = timeout
    if state.interrupted:
        signals.note_stop(state.interrupted)  # a multi-run command starts no further run
        result["interrupted"] = True
        result["interrupted_by"] = state.interrupted
        if state.killed_after_interrupt:
            result["killed_after_interrupt"] = True
    if left:
        result["processes_left"] = left
    if restored is not None:
        result["files_restored"] = restored
        for miss in restored["not_restored"][:5]:
            _say(f"could not put back {miss['path']!r} as it was before this re-run: {miss['why']}")
    if result.get("steps") is None and ranks is None:  # killed before it could say
        result["steps"] = progress.steps
    result.update(returncode=rc, wall_s=round(wall, 3), output_tail=tail.snapshot())
    if ranks is not None:
        result = ranks.finish(result)
    write_json(d / RESULT, result)
    return LaunchResult(outcome=result["outcome"], returncode=rc, wall_s=wall, result=result,
                        output_tail=tail.snapshot())


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Loop:
    """The parent's watch over a running child: timeout, stop signals, lingering exit."""

    def __init__(self, proc: subprocess.Popen, d: Path, ranks: Any, progress: _Progress,
                 tracker: reap.Tracker, timeout: float | None, t0: float):
        self.proc, self.d, self.ranks, self.progress, self.tracker = proc, d, ranks, progress, tracker
        self.timeout = timeout
        self.deadline = t0 + timeout if timeout else None
        self.timed_out = False
        self.interrupted: str | None = None  # the name of the first stop signal
        self.killed_after_interrupt = False
        self.soft_stop_at: float | None = None
        self.soft_grace = 0.0
        self.kill_at: float | None = None
        self.result_seen_at: float | None = None

    def kill(self) -> None:
        if self.ranks is not None:
            self.ranks.kill()
        self.tracker.kill_all(wait_s=0.5)

    def signal_child(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def on_stop_signal(self, signum: int, now: float) -> None:
        if self.interrupted:  # a second stop signal: end it now
            self.killed_after_interrupt = True
            self.kill()
            return
        self.interrupted = signals.name(signum)
        if self.ranks is not None:
            self.ranks.interrupt()
        else:
            self.signal_child(signal.SIGINT)  # KeyboardInterrupt in the script: evidence kept
        grace_end = now + INTERRUPT_GRACE_S
        self.kill_at = grace_end if self.kill_at is None else min(self.kill_at, grace_end)

    def run(self, pending: signals.Pending) -> None:
        last_poll = 0.0
        while True:
            try:
                if self.proc.poll() is not None:
                    return
                now = time.monotonic()
                for signum in pending.take():
                    self.on_stop_signal(signum, now)
                if now - last_poll >= 0.25:
                    last_poll = now
                    self.progress.poll()
                    self.tracker.maybe_snapshot()
                    if self.result_seen_at is None and (
                            self.ranks.results_written() if self.ranks is not None
                            else (self.d / RESULT).exists()):
                        self.result_seen_at = now
                self.check_deadline(now)
                if self.kill_at is not None and now >= self.kill_at and (
                        self.ranks is None or self.ranks.dumps_done()):
                    if self.interrupted and not self.timed_out:
                        self.killed_after_interrupt = True
                    self.kill()
                    self.kill_at = None
                if self.result_seen_at is not None and now - self.result_seen_at > EXIT_GRACE_S:
                    self.kill()  # evidence is written; the script lingers (threads, atexit)
                    self.result_seen_at = float("inf")
                time.sleep(POLL_S)
            except KeyboardInterrupt:  # no handler could be set (not the main thread)
                self.on_stop_signal(signal.SIGINT, time.monotonic())

    def check_deadline(self, now: float) -> None:
        if self.deadline is None or now < self.deadline or self.timed_out:
            return
        if self.ranks is None and self.soft_stop_at is None and self.progress.progressing(now):
            # still making steps: ask for a clean stop at the next step boundary (SIGUSR2),
            # and give it two steps' time (2-15 s) before treating the run as hung
            self.soft_stop_at = now
            self.signal_child(signal.SIGUSR2)
            grace = 2 * (self.progress.step_interval or 0.0) + 0.5
            self.soft_grace = min(STOP_GRACE_MAX_S, max(STOP_GRACE_MIN_S, grace))
            self.deadline = now + self.soft_grace
            return
        self.timed_out = True
        if self.ranks is not None:  # every rank's stacks and flight recorder, not torchrun's
            self.ranks.request_dumps()
        else:
            self.signal_child(signal.SIGUSR1)  # faulthandler: every thread's stack
        self.kill_at = now + STACK_DUMP_WAIT_S


def _say(msg: str) -> None:
    """One line of the launcher's own on stderr (escapes shown: a path is data)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg)
    try:
        sys.stderr.write(f"[torchdoctor] {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
