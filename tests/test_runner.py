"""End-to-end runner tests: the real CLI on fixture scripts (crash, exit code, hang, signal,
Ctrl-C, workers, -m, argv/__file__/sibling imports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fixture_runs import run_fixture

RUN = ROOT / "tests" / "fixtures" / "scripts" / "run"
pytestmark = pytest.mark.slow


def checkup(*args, cwd=RUN, timeout=120):
    p = run_cli("checkup", "--json", *args, cwd=cwd, timeout=timeout)
    assert p.stdout.strip(), p.stderr
    return p, json.loads(p.stdout)


def cached(script, command="checkup"):
    """The session's run of run/SCRIPT under its header command (shared with tests/test_fixtures.py)."""
    r = run_fixture(f"run/{script}", command)
    return r, r.report


def codes(report):
    return sorted(f["code"] for f in report["findings"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
    return True


def test_healthy_script_gets_argv_file_sibling_imports_and_no_finding():
    p, r = cached("healthy.py", "checkup --steps 10 -- --epochs 1 --echo {tmp}/echo.txt")  # the session's run
    echo = p.tmp / "echo.txt"
    assert p.returncode == 0, p.stderr
    assert r["status"] == "ok" and r["findings"] == []
    seen = eval(echo.read_text())
    assert seen["argv"] == ["healthy.py", "--epochs", "1", "--echo", str(echo)]
    assert seen["file"] == str(RUN / "healthy.py") and seen["name"] == "__main__"
    assert r["metrics"]["run"]["outcome"] == "stopped"
    assert r["metrics"]["steps"]["count"] == 10
    assert r["context"]["device"] == "cpu" and r["context"]["torch"]
    # stdout held only the JSON (the shared run parses all of it); the script's own output going to
    # stderr is the next test's


def test_script_output_streams_to_stderr_and_stdout_is_pure_json():
    p, r = checkup("--steps", "0", "healthy.py", "--epochs", "1")
    assert "final loss" in p.stderr
    assert r["metrics"]["run"]["outcome"] == "exit"


def test_module_mode_runs_package_module_with_args():
    p, r = cached("modpkg/train.py", "checkup --steps 5 -m modpkg.train -- --lr 0.2")
    assert p.returncode == 0, p.stderr
    assert r["target"] == "-m modpkg.train"
    assert r["metrics"]["run"]["outcome"] == "stopped" and r["metrics"]["steps"]["count"] == 5
    assert r["findings"] == []


def test_crash_names_exception_and_last_user_frame():
    p, r = cached("crash.py")
    assert p.returncode == 1
    assert r["status"] == "crashed" and codes(r) == ["script-crashed"]
    ev = r["findings"][0]["evidence"]
    assert ev["exception"].startswith("ValueError: bad batch 2")
    assert ev["where"] == "crash.py:13 in check_batch"
    assert ev["step"].startswith("3 ")
    assert "Traceback" in p.stderr  # the user still sees the traceback


def test_sys_exit_code_is_kept_as_evidence():
    p, r = cached("exit_code.py")
    assert codes(r) == ["script-crashed"] and p.returncode == 1
    ev = r["findings"][0]["evidence"]
    assert ev["exit_code"] == 3 and ev["last_output"] == ["validation failed"]
    assert r["metrics"]["run"]["exit_code"] == 3


def test_killed_by_signal():
    p, r = cached("killed.py")
    assert codes(r) == ["killed-by-signal"] and r["status"] == "crashed"
    assert r["findings"][0]["evidence"]["signal"] == "SIGKILL"


@pytest.mark.parametrize("rel,code,extra", [
    ("run/oom_cpu.py", "out-of-memory", {"requested_bytes": 2**47, "where": "oom_cpu.py:11 in <module>"}),
    # training/inplace.py's header is checkup: its run is this crash's (a run/ copy cost a run)
    ("training/inplace.py", "inplace-modified", {"phase": "backward"}),
    ("run/device_meta.py", "device-mismatch", {"devices": ["meta", "cpu"], "phase": "forward"}),
])
def test_crash_classification(rel, code, extra):
    r = run_fixture(rel, "checkup").report  # the session's run (its header command)
    assert codes(r) == [code], r["findings"]
    ev = r["findings"][0]["evidence"]
    for k, v in extra.items():
        assert ev[k] == v, (k, ev)
    if code == "inplace-modified":  # torch 2.13 says "Sigmoid", 2.11 "SigmoidBackward0"
        assert ev["output_of"].startswith("Sigmoid") and ev["tensor"] == "torch.FloatTensor [3, 4]"


def test_device_mismatch_names_the_unregistered_tensor():
    p, r = cached("device_meta.py")
    ev = r["findings"][0]["evidence"]
    assert any(s.startswith("self.scale: cpu") for s in ev["unregistered_tensors"])
    assert "register_buffer" in r["findings"][0]["fix"]


def test_hang_is_stopped_at_timeout_with_line_and_no_process_survives(tmp_path):
    p, r = cached("hang_workers.py", "checkup --timeout 16 -- {tmp}/pids.txt")
    pids_file, took = p.tmp / "pids.txt", p.wall
    assert r["status"] == "timeout" and codes(r) == ["script-hung"]
    ev = r["findings"][0]["evidence"]
    assert ev["stuck_at"] == "hang_workers.py:30 in <module>"
    assert ev["code"].startswith("threading.Event().wait()")
    assert ev["steps_done"] == 3
    assert took < 16 + 30
    pids = [int(x) for x in pids_file.read_text().split()]
    assert len(pids) == 3  # the script and its 2 DataLoader workers
    time.sleep(0.5)
    assert [pid for pid in pids if _alive(pid)] == []


def test_ctrl_c_still_gives_a_report():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "torchdoctor", "checkup", "--json",
                             "sigint_wait.py"], cwd=RUN, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    buf = b""
    fd = proc.stderr.fileno()
    os.set_blocking(fd, False)
    while b"ready" not in buf and time.monotonic() < deadline:
        try:
            buf += os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.1)
    assert b"ready" in buf
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    r = json.loads(out)
    assert r["metrics"]["run"]["outcome"] == "interrupted"
    assert r["metrics"]["steps"]["count"] == 3
    assert r["status"] == "interrupted" and proc.returncode == 130


def test_bad_input_is_one_line_exit_2(tmp_path, cli_inproc):
    p = cli_inproc("checkup", str(tmp_path / "missing.py"))  # in-process: nothing here needs a child
    assert p.returncode == 2 and "script not found" in p.stderr and "Traceback" not in p.stderr
    p = cli_inproc("checkup")
    assert p.returncode == 2 and "missing SCRIPT" in p.stderr
    p = cli_inproc("checkup", "-m", "no_such_module_xyz")
    assert p.returncode == 2 and "module not found" in p.stderr
    p = cli_inproc("checkup", "--steps", "-1", "x.py")
    assert p.returncode == 2

# --out keeps the run dir and report.json: tests/test_out_dir.py (test_a_symlinked_report_is_not_followed,
# whose first run is the same command)


def test_timeout_on_a_progressing_run_stops_it_cleanly_and_judges_it(tmp_path):
    """--timeout bounds a run that still makes steps: it ends at a step boundary, fully judged."""
    script = tmp_path / "slow_steps.py"
    script.write_text(
        "import time, torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.01)\nfor _ in range(1000):\n"
        "    opt.zero_grad(); m(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()\n"
        "    time.sleep(0.2)\n")
    t0 = time.monotonic()
    # 8 s: the bound counts from the launch, and torch's import plus the first steps took 4-6 s
    # on the loaded 2-core box, so a 4 s bound often came before the run was stepping at all
    p, r = checkup("--timeout", "8", "--steps", "0", str(script), timeout=60)
    assert time.monotonic() - t0 < 30
    assert r["status"] == "ok" and codes(r) == [], r["findings"]
    assert r["metrics"]["run"]["outcome"] == "stopped"
    assert r["metrics"]["run"]["reason"] == "--timeout reached"
    assert r["metrics"]["run"]["steps"] >= 5
