"""The parent side of a run: spawn the child harness, stream its output, enforce the timeout.

* The child runs in a new session (its own process group), so on timeout the whole group,
  DataLoader workers included, is killed with one ``os.killpg(SIGKILL)``; the group is also
  killed once the child has exited, so no worker of the script survives the run.
* Timeout: SIGUSR1 first (the child's ``faulthandler`` writes every thread's stack to
  ``stacks.txt``), ~1 s to write it, then SIGKILL to the group.
* Ctrl-C: forwarded to the child as SIGINT (``KeyboardInterrupt`` in the script), which
  writes its evidence; a second Ctrl-C, or 10 s without exit, kills the group.
* The script's stdout and stderr are merged and streamed, line by line, to our stderr
  (stdout is for the report); lines matching ``quiet_patterns`` are dropped; the last lines
  are kept as evidence.
* Progress: new ``step`` events are read from ``events.jsonl`` while the child runs.

Never imports torch.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torchdoctor.runner.rundir import EVENTS, META, RESULT, read_json, write_json

STACK_DUMP_WAIT_S = 1.0
STOP_GRACE_MIN_S, STOP_GRACE_MAX_S = 2.0, 15.0  # a progressing run's clean stop after --timeout
INTERRUPT_GRACE_S = 10.0
EXIT_GRACE_S = 15.0  # after result.json is written, the script gets this long to exit
# the parent's wake-up period while the child runs: 20 ms cost the child ~2-3% of its step on
# the 2-core box (bench/overhead.py cpu_mlp, 9 rounds: 1.024x vs 0.996x at 0.5 s); 0.1 s keeps
# exit, timeout and Ctrl-C handling within a tenth of a second
POLL_S = 0.1
TAIL_LINES = 40
_PKG_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = ("import sys; sys.path.append(sys.argv.pop(1)); "
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
                 show: bool, lock: threading.Lock):
        self.path, self.total, self.on_event, self.show, self.lock = path, total, on_event, show, lock
        self.pos = 0
        self.steps = 0
        self.last_seen: float | None = None  # monotonic time the newest step event was read
        self.step_interval: float | None = None  # seconds per step, from the events' own clock
        self._first: tuple[int, float] | None = None
        self.buf = b""
        self.drawn = False

    def poll(self) -> None:
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
            sys.stderr.write(f"\r\x1b[K[torchdoctor] step {self.steps}{total}")
            sys.stderr.flush()
            self.drawn = True

    def clear(self) -> None:
        """Erase the progress line (called with the lock held)."""
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            self.drawn = False


def _pump(pipe, quiet: list[re.Pattern], tail: collections.deque, lock: threading.Lock,
          progress: _Progress | None) -> None:
    out = getattr(sys.stderr, "buffer", None)
    for raw in iter(pipe.readline, b""):
        text = raw.decode("utf-8", errors="replace")
        if quiet and any(p.search(text) for p in quiet):
            continue
        tail.append(text.rstrip("\n"))
        with lock:
            if progress is not None:
                progress.clear()
            if out is not None:
                out.write(raw)
                out.flush()
            else:
                sys.stderr.write(text)
                sys.stderr.flush()
    pipe.close()


def _killpg(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def launch(run_dir: str | os.PathLike, probe: str, argv: list[str], *, module: bool = False,
           options: dict[str, Any] | None = None, timeout: float | None = None,
           quiet_patterns: list[str] | None = None, show_progress: bool | None = None,
           on_event: Callable[[dict], None] | None = None,
           env: dict[str, str] | None = None, ranks: Any = None) -> LaunchResult:
    """Run ``argv`` (script + args, or module + args) under the harness; blocks until done.

    Writes ``meta.json`` first and the final ``result.json`` last (the child's result plus
    what only the parent knows: timeout, signal, return code, wall time, output tail).
    ``ranks`` (a :class:`torchdoctor.dist.torchrun.RankSet`): run the harness on every rank
    under torchrun, one run dir per rank; timeout, Ctrl-C and clean-up go to every rank.
    """
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    options = dict(options or {})
    write_json(d / META, {"probe": probe, "argv": list(argv), "module": bool(module),
                          "options": options, "cwd": os.getcwd(), "started": time.time()})
    child_env = dict(os.environ)
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env["TORCHDOCTOR_RUN_DIR"] = str(d)
    if env:
        child_env.update(env)
    cmd = [sys.executable, "-c", _BOOT, _PKG_ROOT, str(d)]
    if ranks is not None:
        cmd, child_env = ranks.command(cmd), ranks.env(child_env)
    lock = threading.Lock()
    if show_progress is None:
        show_progress = sys.stderr.isatty()
    steps = options.get("steps")
    progress = _Progress(ranks.events_path() if ranks is not None else d / EVENTS,
                         int(steps) if steps else None, on_event, show_progress, lock)
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    quiet = [re.compile(p) for p in (quiet_patterns or [])]

    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    pgid = proc.pid
    if ranks is not None:
        ranks.started(proc.pid)
    pump = threading.Thread(target=_pump, args=(proc.stdout, quiet, tail, lock, progress),
                            daemon=True)
    pump.start()

    timed_out = interrupted = False
    soft_stop_at: float | None = None
    deadline = t0 + timeout if timeout else None
    kill_at: float | None = None
    result_seen_at: float | None = None
    last_poll = 0.0
    while True:
        try:
            rc = proc.poll()
            if rc is not None:
                break
            now = time.monotonic()
            if now - last_poll >= 0.25:
                last_poll = now
                progress.poll()
                if result_seen_at is None and (ranks.results_written() if ranks is not None
                                               else (d / RESULT).exists()):
                    result_seen_at = now
            if (deadline is not None and now >= deadline and ranks is None and soft_stop_at is None
                    and progress.progressing(now)):
                # still making steps: ask for a clean stop at the next step boundary (SIGUSR2),
                # and give it two steps' time (2-15 s) before treating the run as hung
                soft_stop_at = now
                try:
                    os.kill(proc.pid, signal.SIGUSR2)
                except ProcessLookupError:
                    pass
                grace = 2 * (progress.step_interval or 0.0) + 0.5
                deadline = now + min(STOP_GRACE_MAX_S, max(STOP_GRACE_MIN_S, grace))
            if deadline is not None and now >= deadline and not timed_out:
                timed_out = True
                if ranks is not None:  # every rank's stacks and flight recorder, not torchrun's
                    ranks.request_dumps()
                else:
                    try:
                        os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
                    except ProcessLookupError:
                        pass
                kill_at = now + STACK_DUMP_WAIT_S
            if kill_at is not None and now >= kill_at and (ranks is None or ranks.dumps_done()):
                if ranks is not None:
                    ranks.kill()
                _killpg(pgid)
                kill_at = None
            if result_seen_at is not None and now - result_seen_at > EXIT_GRACE_S:
                if ranks is not None:
                    ranks.kill()
                _killpg(pgid)  # evidence is written; the script lingers (threads, atexit)
                result_seen_at = float("inf")
            time.sleep(POLL_S)
        except KeyboardInterrupt:
            if interrupted:  # second Ctrl-C: stop now
                if ranks is not None:
                    ranks.kill()
                _killpg(pgid)
                continue
            interrupted = True
            if ranks is not None:
                ranks.interrupt()
            else:
                try:
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            kill_at = time.monotonic() + INTERRUPT_GRACE_S
    wall = time.monotonic() - t0
    _killpg(pgid)  # whatever the script left behind (DataLoader workers, subprocesses)
    if ranks is not None:
        ranks.kill()  # ranks run in sessions of their own: the group kill does not reach them
    pump.join(timeout=3.0)
    progress.poll()
    with lock:
        progress.clear()
        sys.stderr.flush()

    result = read_json(d / RESULT) or {}
    rc = proc.returncode
    if timed_out:
        result = {**result, "outcome": "timeout", "timeout_s": timeout,
                  "child_outcome": result.get("outcome")}
    elif not result or "outcome" not in result:
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            result = {**result, "outcome": "signal", "signal": name, "signum": -rc}
        elif interrupted:
            result = {**result, "outcome": "interrupted"}
        else:  # os._exit() or a harness failure before result.json
            result = {**result, "outcome": "exit", "exit_code": rc, "no_result": True}
    if soft_stop_at is not None and not timed_out:
        result["stopped_by_timeout"] = timeout
    if interrupted:
        result["interrupted"] = True
    result.update(returncode=rc, wall_s=round(wall, 3), output_tail=list(tail))
    if ranks is not None:
        result = ranks.finish(result)
    write_json(d / RESULT, result)
    return LaunchResult(outcome=result["outcome"], returncode=rc, wall_s=wall, result=result,
                        output_tail=list(tail))
