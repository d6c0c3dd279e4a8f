"""GPU truth on a real GPU (skipped without CUDA): torchdoctor's printed step time against the
script's own synchronised timer in the same run, and no tool-induced memory — the workload's
``torch.cuda.memory_allocated()`` at every step end under each probe (and under treat's baseline)
equals the plain run's within one allocator block. The full table: bench/gpu_truth.py.

Run on a GPU machine: PYTHONPATH=$PWD python3 -m pytest -q -m gpu tests/test_gpu_truth.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "bench" / "workloads" / "truth_mlp.py"
ARGS = ["--width", "2048", "--batch", "1024", "--steps", "16", "--warmup", "6"]
BLOCK = 2 * 2**20


def _plain(tmp_path) -> dict:
    res = tmp_path / "plain.json"
    subprocess.run([sys.executable, str(MLP), *ARGS, "--result", str(res)], check=True, timeout=300,
                   cwd=str(ROOT))
    return json.loads(res.read_text())


@pytest.mark.gpu
@pytest.mark.parametrize("command", [["checkup"], ["memory"], ["nan"], ["profile"],
                                     # treat's baseline alone: the one trial asked for does not
                                     # apply to an MLP (no Conv2d), so only the baseline runs
                                     ["treat", "--try", "channels-last"]])
def test_no_probe_adds_memory_and_the_step_time_is_the_scripts_own(cli, tmp_path, command):
    plain = _plain(tmp_path)
    res = tmp_path / "probe.json"
    p = cli(*command, "--json", "--steps", "0", MLP, *ARGS, "--result", res, timeout=400)
    rep = json.loads(p.stdout)
    truth = json.loads(res.read_text())
    a, b = truth["memory_at_step_end"], plain["memory_at_step_end"]
    assert len(a) == len(b)
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= BLOCK, f"{command}: memory_allocated differs by {worst} B at a step end"
    assert not [f for f in rep["findings"] if f["code"] in ("memory-growth", "internal-error")], rep["findings"]
    st = rep["metrics"].get("steps") or {}
    if command[0] != "treat":
        assert st["median_step_ms"] == pytest.approx(truth["step_ms"], rel=0.10), (st, truth)
        assert st["step_time_basis"].startswith("device span")
