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

import collections
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from torchdoctor.runner import lifeline, reap, signals
from torchdoctor.runner.rundir import EVENTS, META, RESULT, read_json, write_json

STACK_DUMP_WAIT_S = 1.0
STOP_GRACE_MIN_S, STOP_GRACE_MAX_S = 2.0, 15.0  # a progressing run's clean stop after --timeout
INTERRUPT_GRACE_S = 5.0  # after a stop signal (Ctrl-C, SIGTERM, SIGHUP) the child gets this long
EXIT_GRACE_S = 15.0  # after result.json is written, the script gets this long to exit
# the parent's wake-up period while the child runs: 20 ms cost the child ~2-3% of its step on
# the 2-core box (bench/overhead.py cpu_mlp, 9 rounds: 1.024x vs 0.996x at 0.5 s); 0.1 s keeps
# exit, timeout and Ctrl-C handling within a tenth of a second
POLL_S = 0.1
TAIL_LINES = 40
TAIL_LINE_MAX = 2000  # characters kept of each tail line (its end)
CHUNK = 65536  # bytes read from the child's output at a time
HOLD_S = 0.05  # a partial line (progress bar, prompt) is written after this long without output
HOLD_MAX = 65536  # ... or at once when it grows past this many bytes
PLAIN_EVERY_S = 5.0  # without a terminal: a plain progress line this often
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


def launch(run_dir: str | os.PathLike, probe: str, argv: list[str], *, module: bool = False,
           options: dict[str, Any] | None = None, timeout: float | None = None,
           quiet_patterns: list[str] | None = None, show_progress: bool | None = None,
           on_event: Callable[[dict], None] | None = None,
           env: dict[str, str] | None = None, ranks: Any = None,
           needs: Iterable[str] | None = None) -> LaunchResult:
    """Run ``argv`` (script + args, or module + args) under the harness; blocks until done.

    Writes ``meta.json`` first and the final ``result.json`` last (the child's result plus
    what only the parent knows: timeout, signal, return code, wall time, output tail).
    ``ranks`` (a :class:`torchdoctor.distributed.torchrun.RankSet`): run the harness on every rank
    under torchrun, one run dir per rank; timeout, Ctrl-C and clean-up go to every rank.
    ``needs``: the evidence kinds to arm instruments for (the caller's
    ``torchdoctor.pipeline.registry.armed_needs(probe)``; none: the script runs unmeasured).
    """
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    options = dict(options or {})
    write_json(d / META, {"probe": probe, "argv": list(argv), "module": bool(module),
                          "options": options, "cwd": os.getcwd(), "started": time.time(),
                          "needs": sorted(needs or ())})
    child_env = dict(os.environ)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["TORCHDOCTOR_RUN_DIR"] = str(d)
    run_id = child_env[reap.RUN_ID_ENV] = uuid.uuid4().hex  # marks every process of this run
    if env:
        child_env.update(env)
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
        pump = threading.Thread(target=_Pump(proc.stdout, quiet, tail, lock, progress).run,
                                daemon=True, name="torchdoctor-output")
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
        result["interrupted"] = True
        result["interrupted_by"] = state.interrupted
        if state.killed_after_interrupt:
            result["killed_after_interrupt"] = True
    if left:
        result["processes_left"] = left
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
