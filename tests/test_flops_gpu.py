"""The yardstick on a GPU (docs/yardstick.md): the FLOPs of a bf16 MLP step counted exactly, and
its MFU against the data-sheet peak. Needs CUDA (skipped otherwise).

Run on a GPU machine: PYTHONPATH=$PWD python3 -m pytest -q -m gpu tests/test_flops_gpu.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts" / "profile"


@pytest.mark.gpu
def test_a_bf16_matmul_step_gets_its_exact_flops_and_an_mfu(cli):
    p = cli("profile", "--steps", "12", "--json", SCRIPTS / "gpu_bf16_matmul.py", timeout=300)
    assert p.stdout.strip(), p.stderr[-3000:]
    m = json.loads(p.stdout)["metrics"]["flops"]
    assert m["status"] == "ok", m
    # four 8192x8192 layers, 8192 rows, input without grad: 4 B N^2 for the first, 6 B N^2 each other
    assert m["flops_per_step"] == 22 * 8192 ** 3 and m["flops_by_dtype"] == {"bf16": 22 * 8192 ** 3}
    assert m["dtype"] == "bf16" and m["device"] == "cuda" and m["counted_step"] == 2
    print("\nyardstick:", json.dumps({k: m.get(k) for k in ("device_name", "step_ms", "achieved_flops_per_s",
                                                         "peak_flops_per_s", "mfu", "counter_cost")}))
    if m["device_name"] == "NVIDIA H100 80GB HBM3":
        assert m["peak_flops_per_s"] == pytest.approx(989.5e12)
        assert 0.30 <= m["mfu"] <= 0.85, m
    elif m.get("mfu") is None:
        assert m["mfu_reason"]
    else:
        assert 0.05 <= m["mfu"] <= 1.0, m


@pytest.mark.gpu
def test_fp32_without_tf32_is_measured_against_the_fp32_peak(cli):
    """gpu_fp32.py keeps TF32 off: its matmuls are fp32 on the CUDA cores (67 TFLOP/s on an H100 SXM):
    ``mfu_dtype_peak`` is against that; the MFU against the card's one bf16 peak."""
    p = cli("profile", "--json", SCRIPTS / "gpu_fp32.py", timeout=300)
    m = json.loads(p.stdout)["metrics"]["flops"]
    assert m["status"] == "ok" and set(m["flops_by_dtype"]) == {"fp32"}, m
    print("\nyardstick fp32:", json.dumps({k: m.get(k) for k in ("device_name", "step_ms", "mfu",
                                                                    "mfu_dtype_peak")}))
    if m["device_name"] in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        assert m["dtype_peak_flops_per_s"] == pytest.approx(67e12) and 0.2 <= m["mfu_dtype_peak"] <= 1.0, m
        assert m["peak_flops_per_s"] == pytest.approx(989.5e12) and m["mfu"] < 0.1, m
