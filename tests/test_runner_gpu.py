"""GPU end-to-end tests of the runner and checkup (run on the H100 box: pytest -m gpu)."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_cli

PERF = ROOT / "tests" / "fixtures" / "scripts" / "perf"
pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def checkup(script, steps=30):
    p = run_cli("checkup", "--json", "--steps", str(steps), script, cwd=PERF, timeout=300)
    assert p.stdout.strip(), p.stderr[-3000:]
    return p, json.loads(p.stdout)


def codes(r, min_sev="info"):
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(f["code"] for f in r["findings"] if order[f["severity"]] <= order[min_sev])


def one(r, code):
    [f] = [f for f in r["findings"] if f["code"] == code]
    return f


def test_healthy_gpu_script_raises_nothing_and_has_device_times():
    p, r = checkup("gpu_healthy.py", steps=40)
    assert codes(r) == [], r["findings"]
    assert r["context"]["device"].startswith("cuda:0")
    dev = r["metrics"]["steps"]["device"]
    assert dev["steps"] >= 20
    assert dev["forward_ms"] > 0 and dev["backward_ms"] > 0 and dev["optimizer_ms"] > 0
    assert 0 < dev["busy"] <= 1


def test_gpu_dataloader_bound_with_file_line():
    p, r = checkup("gpu_slow_loader.py", steps=15)
    assert codes(r, "warning") == ["dataloader-bound"], r["findings"]
    ev = one(r, "dataloader-bound")["evidence"]
    assert ev["loop"] == "gpu_slow_loader.py:27"
    assert "gpu_slow_loader.py:15" in ev["slowest_stage"]
    assert ev["gpu_busy_at_most"] <= 0.75


def test_gpu_device_mismatch_names_the_cpu_tensor():
    p, r = checkup("gpu_device_mismatch.py")
    assert codes(r) == ["device-mismatch"], r["findings"]
    ev = one(r, "device-mismatch")["evidence"]
    assert sorted(ev["devices"]) == ["cpu", "cuda:0"]
    assert any(s.startswith("self.class_weights: cpu") for s in ev["unregistered_tensors"])
    assert ev["where"].startswith("gpu_device_mismatch.py:18")


def test_gpu_oom_is_classified_with_numbers():
    p, r = checkup("gpu_oom.py")
    assert "out-of-memory" in codes(r)
    ev = one(r, "out-of-memory")["evidence"]
    assert ev["requested_bytes"] >= 2**40 and ev["capacity_bytes"] > 10 * 2**30
    assert ev["step"].startswith("3 ")


def test_gpu_model_moved_in_loop_is_a_warning():
    p, r = checkup("gpu_moved.py", steps=20)
    assert codes(r, "warning") == ["model-moved-in-loop"], r["findings"]
    f = one(r, "model-moved-in-loop")
    assert f["severity"] == "warning" and f["evidence"]["real_copies"] >= 10
    assert f["evidence"]["site"] in ("gpu_moved.py:20", "gpu_moved.py:23")
