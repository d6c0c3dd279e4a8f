"""Helpers of the process tests: start torchdoctor, watch every process it starts, check none
survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


class Watched:
    """``python -m torchdoctor ARGS`` with every descendant recorded (pid, start time) while
    it lives, so processes that leave the tree (setsid, orphans) are still checked."""

    def __init__(self, *args: str, cwd: str | os.PathLike | None = None, env: dict | None = None):
        e = dict(os.environ)
        e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
        e.setdefault("COLUMNS", "120")
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", *map(str, args)],
                                     cwd=cwd, env=e, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.seen: dict[int, float] = {}
        self._stop = False
        self.err = b""
        os.set_blocking(self.proc.stderr.fileno(), False)
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()

    def _watch(self) -> None:
        try:
            me = psutil.Process(self.proc.pid)
            self.seen[me.pid] = me.create_time()
        except psutil.Error:
            return
        while not self._stop:
            try:
                for c in me.children(recursive=True):
                    try:
                        self.seen.setdefault(c.pid, c.create_time())
                    except psutil.Error:
                        pass
            except psutil.Error:
                return
            time.sleep(0.03)

    def read_err(self) -> bytes:
        try:
            while True:
                b = os.read(self.proc.stderr.fileno(), 65536)
                if not b:
                    break
                self.err += b
        except BlockingIOError:
            pass
        return self.err

    def wait_for(self, text: bytes, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.read_err():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"never saw {text!r}: {self.read_err()[-3000:]!r}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        os.set_blocking(self.proc.stderr.fileno(), True)
        out, err = self.proc.communicate(timeout=timeout)
        self.err += err
        self._stop = True
        return self.proc.returncode, out.decode()

    def run_alive_at(self, when: float, extra: list[int] = ()) -> list[int]:
        """Pids of the run other than torchdoctor itself still alive at monotonic time ``when``
        (torchdoctor may still be writing its report)."""
        while time.monotonic() < when:
            self.read_err()
            time.sleep(0.05)
        return [p for p in set(self.seen) | set(extra)
                if p != self.proc.pid and alive(p, self.seen.get(p))]

    def survivors(self, extra: list[int] = (), within_s: float = 10.0) -> list[int]:
        """Pids of this run (watched or ``extra``) still alive ``within_s`` after now."""
        deadline = time.monotonic() + within_s
        while True:
            left = [p for p in set(self.seen) | set(extra) if alive(p, self.seen.get(p))]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def alive(pid: int, created: float | None = None) -> bool:
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 0.01:
            return False  # the pid was recycled
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_leftovers(pids) -> None:
    """Test hygiene: end what a failing test left behind (only the pids it recorded)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
