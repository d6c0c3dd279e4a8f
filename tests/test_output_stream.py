"""The parent's handling of the script's output and input (issue 14 items 4, 12; issue 13
item 17): bounded memory whatever the script writes, ``\\r`` progress bars passed on as drawn,
stdin passed through, ``-m pkg.mod`` found from the current folder, a plain progress line
without a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT

OUTSTREAM = ROOT / "tests" / "fixtures" / "outstream"
pytestmark = pytest.mark.slow


def _env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


class _Scan:
    """Reads a pipe to its end on a thread, keeping only which of ``texts`` it has seen: the
    script's 300 MiB line passes through without being held."""

    def __init__(self, pipe, texts: tuple[bytes, ...]) -> None:
        self.pipe, self.texts, self.seen = pipe, texts, set()
        self.tail = b""
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        keep = max(map(len, self.texts))
        while chunk := self.pipe.read1(1 << 20):
            window = self.tail[-keep:] + chunk
            self.seen.update(t for t in self.texts if t in window)
            self.tail = window[-4096:]

    def wait_for(self, text: bytes, proc: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert time.monotonic() < deadline and proc.poll() is None, (text, self.tail[-2000:])
            time.sleep(0.05)


def test_output_and_input_pass_through_a_bounded_parent(tmp_path):
    """One run of tests/fixtures/outstream's `-m pkg.train` (four checks that each had a run of
    their own, on independent paths of the parent):

    - a long line without newline (300 MiB): torchdoctor's own peak RSS stays under 300 MB (it was
      3x the line);
    - carriage-return progress is passed on before any newline: `[bar] 1/2` arrives while the
      script still waits mid-line for the file `go`;
    - stdin is passed to the script as python would;
    - `-m pkg.train` is found from the current folder without it on sys.path (the console entry
      point's sys.path does not hold the current folder: simulated with python -P)."""
    rss, go = tmp_path / "maxrss", tmp_path / "go"
    # VmHWM, not ru_maxrss: Linux carries the parent's RSS at fork into a child's ru_maxrss
    # across exec, so under a big pytest process ru_maxrss read 759 MB for a 21 MB torchdoctor
    boot = ("import atexit, re, runpy, sys\n"
            f"atexit.register(lambda: open({str(rss)!r}, 'w').write(re.search("
            "r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))\n"
            "sys.argv = ['torchdoctor'] + sys.argv[1:]\n"
            "runpy.run_module('torchdoctor', run_name='__main__')\n")
    p = subprocess.Popen([sys.executable, "-P", "-c", boot, "checkup", "--json", "-m", "pkg.train",
                          str(go), "300"], cwd=OUTSTREAM, env=_env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    texts = (b"[bar] 1/2", b"[bar] 2/2", b"stdin said: 'hello from a pipe'", b"pkg.helper imported",
             b"wrote everything")
    err = _Scan(p.stderr, texts)
    try:
        p.stdin.write(b"hello from a pipe\n")
        p.stdin.close()
        err.wait_for(b"[bar] 1/2", p, timeout=120)  # still mid-line: the script waits for `go`
        assert p.poll() is None
        go.write_text("1")
        out = p.stdout.read()
        assert p.wait(timeout=300) == 0, err.tail[-3000:]
        err.t.join(timeout=60)
    finally:
        go.write_text("1")
        if p.poll() is None:
            p.kill()
            p.wait()
    assert err.seen == set(texts), (err.seen, err.tail[-3000:])
    r = json.loads(out)
    assert r["metrics"]["run"]["outcome"] == "exit", r["metrics"]["run"]
    assert r["metrics"]["steps"]["count"] == 2
    peak_mb = int(rss.read_text()) / 1024
    assert peak_mb < 300, f"torchdoctor peaked at {peak_mb:.0f} MB"


def test_the_tail_keeps_the_end_of_a_long_line_only(tmp_path):
    from torchdoctor.runner.launch import TAIL_LINE_MAX, _Tail

    t = _Tail()
    for _ in range(100):
        t.feed("y" * 10_000, b"")
    t.feed("", b"\n")
    t.feed("10%", b"\r")
    t.feed("20%", b"\r")
    t.feed("done", b"\n")
    assert t.snapshot() == ["y" * TAIL_LINE_MAX, "done"]


def test_plain_progress_line_without_a_terminal():
    from fixture_runs import run_fixture

    p = run_fixture("proc/slow_steps.py", "checkup --steps 25 -- 40")  # the session's run
    lines = re.findall(r"^\[torchdoctor\] step (\d+)/25, (\d+) s elapsed$", p.stderr, flags=re.M)
    assert lines, p.stderr[-2000:]
    assert p.wall > 7
    assert "\x1b[K" not in p.stderr  # no terminal drawing codes in a log
