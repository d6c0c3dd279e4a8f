"""`torchdoctor profile` on the GPU fixture scripts: each sick script raises exactly its codes,
with the planted file:line; the healthy one raises no warning. Needs CUDA (skipped otherwise).

Run on a GPU machine: PYTHONPATH=$PWD python3 -m pytest -q -m gpu tests/test_profile_gpu.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts" / "profile"

# script -> (exact codes, {code: "file:line" the finding must name in its title})
EXPECTED = {
    "gpu_healthy.py": (set(), {}),
    "gpu_sync.py": ({"host-sync-in-loop", "launch-bound"}, {"host-sync-in-loop": "gpu_sync.py:21"}),
    "gpu_launch.py": ({"launch-bound"}, {}),
    "gpu_pageable.py": ({"pageable-h2d-copy"}, {"pageable-h2d-copy": "gpu_pageable.py:17"}),
    "gpu_fp32.py": ({"fp32-compute-bound"}, {}),
    "gpu_dataloader.py": ({"dataloader-bound"}, {"dataloader-bound": "gpu_dataloader.py:"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_gpu_fixture_raises_exactly_its_codes(cli, script, tmp_path):
    codes, lines = EXPECTED[script]
    p = cli("profile", "--json", "--out", tmp_path, SCRIPTS / script, timeout=300)
    assert p.stdout.strip(), p.stderr[-3000:]
    rep = json.loads(p.stdout)
    found = {f["code"]: f for f in rep["findings"]}
    assert set(found) == codes, [(f["code"], f["title"]) for f in rep["findings"]]
    for code, where in lines.items():
        assert where in found[code]["title"], found[code]["title"]
    m = rep["metrics"]["profile"]
    assert m["status"] == "ok" and m.get("gpu")
    assert (tmp_path / "trace.json").exists()
    assert "profiler_start" not in p.stderr and "Profiler clears events" not in p.stderr
    if not codes:
        assert p.returncode == 0
