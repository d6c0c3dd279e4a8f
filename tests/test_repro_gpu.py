"""`torchdoctor repro` on a CUDA GPU: float atomics in index_add_ are a nondeterministic op, and
deterministic mode makes the runs identical (at a measured cost).

Run on the GPU box: ``PYTHONPATH=$PWD python3 -m pytest -m gpu tests/test_repro_gpu.py``.
"""

from __future__ import annotations

import json

import pytest

from fixture_runs import SCRIPTS, run_fixture

pytestmark = pytest.mark.gpu
FIXTURE = "repro/op_index_add_cuda.py"


def _check(rep: dict, findings: list) -> None:
    assert [f["code"] for f in findings] == ["nondeterministic-op"], json.dumps(findings)[:3000]
    op = rep["first_divergent_op"]
    assert op["op"] == "aten::index_add_" and op["inputs_equal"] is True, op
    assert op["where"].endswith("op_index_add_cuda.py:29") and op["module"] == "model", op
    det = rep["deterministic"]
    assert det["reproducible"] is True, det  # deterministic mode: identical runs
    assert det["cost"] and det["cost"] > 0 and det["median_step_ms"] > 0, det
    assert "index_add_" in findings[0]["title"] and "×" in findings[0]["fix"]


def test_index_add_on_cuda_is_a_nondeterministic_op_fixed_by_deterministic_mode():
    run = run_fixture(FIXTURE)
    rep = run.report["metrics"]["repro"]
    assert rep["first_divergent_step"] == 1 and rep["diverged"]["what"] in ("forward", "loss")
    _check(rep, run.report["findings"])


def test_the_dispatch_mode_engine_names_the_same_op(cli):
    p = cli("repro", "--json", "--steps", "3", "--op-engine", "dispatch", SCRIPTS / FIXTURE, timeout=900)
    report = json.loads(p.stdout)
    rep = report["metrics"]["repro"]
    assert rep["op_trace"]["engine"] == "dispatch"
    _check(rep, report["findings"])
