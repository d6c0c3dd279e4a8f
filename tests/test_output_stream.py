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

import pytest

from conftest import ROOT, run_cli
from proc_helpers import Watched, kill_leftovers

PROC = ROOT / "tests" / "fixtures" / "scripts" / "proc"
pytestmark = pytest.mark.slow


def _env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def test_a_long_line_without_newline_keeps_torchdoctor_small(tmp_path):
    """300 MiB in one line: torchdoctor's own peak RSS stays under 300 MB (it was 3x the line)."""
    rss = tmp_path / "maxrss"
    # VmHWM, not ru_maxrss: Linux carries the parent's RSS at fork into a child's ru_maxrss
    # across exec, so under a big pytest process ru_maxrss read 759 MB for a 21 MB torchdoctor
    boot = ("import atexit, re, runpy, sys\n"
            f"atexit.register(lambda: open({str(rss)!r}, 'w').write(re.search("
            "r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))\n"
            "sys.argv = ['torchdoctor'] + sys.argv[1:]\n"
            "runpy.run_module('torchdoctor', run_name='__main__')\n")
    with open(os.devnull, "wb") as null:
        p = subprocess.run([sys.executable, "-c", boot, "checkup", "--json", "no_newline.py", "300"],
                           cwd=PROC, env=_env(), stdout=subprocess.PIPE, stderr=null, timeout=300)
    r = json.loads(p.stdout)
    assert r["metrics"]["run"]["outcome"] == "exit", r["metrics"]["run"]
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


def test_carriage_return_progress_is_passed_on_before_any_newline(tmp_path):
    go = tmp_path / "go"
    w = Watched("checkup", "--json", "progress_bar.py", go, cwd=PROC)
    try:
        w.wait_for(b"[bar] 1/3", timeout=60)  # still mid-line: the script waits for `go`
        assert w.proc.poll() is None
        go.write_text("1")
        rc, out = w.finish(timeout=60)
        assert rc == 0 and b"[bar] 3/3" in w.err
    finally:
        go.write_text("1")
        kill_leftovers(list(w.seen))


def test_stdin_is_passed_to_the_script_as_python_would():
    p = run_cli("checkup", "--json", "read_stdin.py", input="hello from a pipe\n", cwd=PROC)
    assert "stdin said: 'hello from a pipe'" in p.stderr, p.stderr[-2000:]


def test_module_is_found_from_the_current_folder_without_it_on_sys_path():
    """`torchdoctor checkup -m pkg.train` from the folder holding pkg/ (the console entry
    point's sys.path does not hold the current folder: simulated with python -P)."""
    p = subprocess.run([sys.executable, "-P", "-m", "torchdoctor", "checkup", "--json", "-m",
                        "pkg.train"], cwd=PROC / "modproj", env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "pkg.helper imported" in p.stderr
    assert json.loads(p.stdout)["metrics"]["steps"]["count"] == 2


def test_plain_progress_line_without_a_terminal():
    from fixture_runs import run_fixture

    p = run_fixture("proc/slow_steps.py", "checkup --steps 25 -- 40")  # the session's run
    lines = re.findall(r"^\[torchdoctor\] step (\d+)/25, (\d+) s elapsed$", p.stderr, flags=re.M)
    assert lines, p.stderr[-2000:]
    assert p.wall > 7
    assert "\x1b[K" not in p.stderr  # no terminal drawing codes in a log
