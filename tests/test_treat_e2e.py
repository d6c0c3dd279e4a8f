"""treat end to end on CPU: the loader-bound fixture adopts dataloader-workers (>= 1.3x, the
acceptance), a healthy script with forced trials adopts nothing that fails the loss check and a
crashing treatment is `failed` while the run goes on, no user file changes, Ctrl-C stops the
schedule and the report of what ran is printed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixture_runs import SCRIPTS, host_noise, read_header, run_fixture

TREAT = SCRIPTS / "treat"
ROOT = Path(__file__).resolve().parents[1]


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _trial(report: dict, name: str) -> dict:
    return next(e for e in report["metrics"]["trials"] if e["name"] == name)


@pytest.fixture(scope="module")
def untouched():
    before = _hashes(TREAT)
    yield
    assert _hashes(TREAT) == before, "a treat run changed a file of the user's folder"


def test_loader_bound_adopts_dataloader_workers_with_a_measured_speedup(untouched):
    run = run_fixture("treat/loader_bound.py")
    r = run.report
    assert run.returncode == 1 and run.codes == {"dataloader-bound@error"}
    e = _trial(r, "dataloader-workers")
    assert e["verdict"] == "adopt", (e["reason"], e["rounds"], e["spread"])
    assert e["speedup"] >= 1.3 and e["rounds"] == {"baseline": 2, "treated": 2}
    assert e["loss_ok"] is True and e["loss_max_rel_diff"] == 0.0  # the same batches
    assert e["setting"] == "num_workers=2, persistent_workers=True, prefetch_factor=2"
    assert e["where"] == ["loader_bound.py:30"]
    assert "DataLoader(..., num_workers=2, persistent_workers=True, prefetch_factor=2)" in e["fix"]
    f = next(f for f in r["findings"] if f["code"] == "dataloader-bound")
    assert f["evidence"]["treat"] == {"dataloader-workers": e["speedup"]}
    skipped = {x["name"]: x["reason"] for x in r["metrics"]["trials"] if x["verdict"] == "skipped"}
    assert skipped["tf32"] == "no CUDA" and len(r["metrics"]["trials"]) == 10
    assert r["metrics"]["treat"]["runs"] == 4 and r["metrics"]["treat"]["stopped"] is None
    print(f"\nloader_bound: dataloader-workers {e['speedup']}x "
          f"({e['baseline_step_ms']} -> {e['treated_step_ms']} ms/step, band {e['noise_band']})")


def test_forced_trials_a_crash_is_failed_the_run_goes_on_and_the_loss_is_kept(untouched):
    run = run_fixture("treat/healthy_grad_check.py")
    r = run.report
    assert run.returncode == 0 and run.codes == set()
    s = _trial(r, "set-to-none")
    assert s["verdict"] == "failed" and s["rounds"]["treated"] == 0
    assert s["error"].startswith("AttributeError: 'NoneType' object has no attribute 'abs' at ")
    assert s["error"].endswith("healthy_grad_check.py:21")
    f = _trial(r, "fused-optimizer")  # ran after the failure, both rounds
    assert f["rounds"] == {"baseline": 2, "treated": 2} and f["verdict"] in ("adopt", "noise", "reject")
    assert f["loss_ok"] is True and f["loss_max_rel_diff"] <= f["loss_allowed"]
    assert all(e["loss_ok"] is True for e in r["metrics"]["trials"] if e["verdict"] == "adopt")
    assert [e["name"] for e in r["metrics"]["trials"]] == ["fused-optimizer", "set-to-none"]
    assert r["metrics"]["treat"]["runs"] == 5  # B, F, S (failed: not repeated), B, F


def test_ctrl_c_stops_the_schedule_and_prints_the_report_of_what_ran(tmp_path):
    h = read_header(TREAT / "loader_bound.py")
    assert h is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.Popen([sys.executable, "-m", "torchdoctor", "treat", "--json", "--steps", "60",
                          "loader_bound.py"], cwd=TREAT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_lines: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the baseline's progress line: trial 1 starts now
        line = p.stderr.readline()
        if not line:
            break
        err_lines.append(line)
        if "baseline (round 1)" in line:
            break
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=120)
    err = "".join(err_lines) + rest
    assert p.returncode == 130, err[-2000:]
    r = json.loads(out)
    assert r["status"] == "interrupted" and r["metrics"]["treat"]["stopped"] == "interrupted"
    assert "[3/" not in err  # no run after the interrupted one
    e = _trial(r, "dataloader-workers")
    assert e["verdict"] == "skipped" and e["reason"] == "not run: interrupted (Ctrl-C)"
    assert [f["code"] for f in r["findings"] if not host_noise(f)] == ["dataloader-bound"]  # the baseline's
