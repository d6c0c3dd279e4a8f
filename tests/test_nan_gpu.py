"""The nan probe on a CUDA GPU: float16 / bfloat16 autocast variants, and the sync budget.

Run on the GPU box: ``PYTHONPATH=$PWD python3 -m pytest -m gpu tests/test_nan_gpu.py``.
"""

from __future__ import annotations

import json

import pytest

from test_nan_fixtures import SCRIPTS, by_code, codes, judge

pytestmark = pytest.mark.gpu
NONFINITE = {"nonfinite-forward", "nonfinite-gradient", "nonfinite-loss"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_autocast_nan_is_localized_in_both_dtypes(dtype):
    rep = judge("nan", SCRIPTS / "nan/autocast_div.py", (dtype,))
    assert codes(rep) == {"nonfinite-forward"}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == 6 and f.evidence["module"] == "model.1"
    assert f.evidence["op"] == "aten::div"
    assert dtype in f.evidence["output_stats"][0]


def test_float16_overflow_on_cuda_names_the_linear():
    rep = judge("nan", SCRIPTS / "nan/fp16_overflow.py", ("float16",))
    assert codes(rep) == {"nonfinite-forward"}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == 4 and f.evidence["module_class"] == "Linear"
    assert "Inf" in f.title and ("mm" in f.evidence["op"] or "linear" in f.evidence["op"])


def test_bfloat16_does_not_overflow_on_cuda():
    rep = judge("nan", SCRIPTS / "nan/fp16_overflow.py", ("bfloat16",))
    assert not codes(rep) & NONFINITE


def test_fp16_without_scaler_on_cuda():
    rep = judge("nan", SCRIPTS / "training/fp16_no_scaler.py")
    assert codes(rep) == {"fp16-without-scaler"}
    assert by_code(rep, "fp16-without-scaler").evidence["autocast_devices"] == ["cuda"]


def test_healthy_mixed_precision_on_cuda():
    rep = judge("nan", SCRIPTS / "nan/healthy_amp.py")
    assert codes(rep) == set(), [(f.code, f.title) for f in rep.findings]


def test_at_most_one_sync_per_step(tmp_path):
    out = tmp_path / "syncs.json"
    bare = tmp_path / "bare.json"
    judge("run", SCRIPTS / "nan/cuda_sync_count.py", (str(bare),))
    judge("nan", SCRIPTS / "nan/cuda_sync_count.py", (str(out),))
    base = json.loads(bare.read_text())["syncs"]
    got = json.loads(out.read_text())["syncs"]
    # steady state (after the first steps' one-off set-up): the probe adds <= 1 sync per step
    extra = [g - b for g, b in zip(got[3:], base[3:])]
    assert max(extra) <= 1, (base, got)


@pytest.mark.parametrize("script,args,code,step,module", [
    ("nan/masked_attention.py", ("4",), "nonfinite-forward", 5, "model"),
    ("nan/inplace_residual.py", (), "nonfinite-forward", 4, "model.0"),
    ("nan/forward_div.py", (), "nonfinite-forward", 6, "model.0"),
    ("nan/grad_sqrt.py", (), "nonfinite-gradient", 5, None),
])
def test_cpu_fixtures_on_cuda_use_the_fused_check(script, args, code, step, module):
    """The CPU fixtures with CUDA as the default device: the forward watch's fused max |x|
    reduction (one ``_foreach_norm`` per dtype) finds the same first value at the same step."""
    import torch

    torch.set_default_device("cuda")
    try:
        rep = judge("nan", SCRIPTS / script, args, {"rerun": False})
    finally:
        torch.set_default_device(None)
    assert codes(rep) == {code}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, code)
    assert f.evidence["step"] == step
    if module is not None:
        assert f.evidence["module"] == module
    if code == "nonfinite-forward" and "outputs" in f.evidence:
        assert all("max|x|" in line for line in f.evidence["outputs"])
    if script == "nan/masked_attention.py":
        assert "PadMask" in f.evidence["earlier_neg_inf"]


@pytest.mark.parametrize("probe,script", [("nan", "nan/healthy_mixed.py"),
                                          ("nan", "nan/masked_attention.py"),
                                          ("nan", "nan/healthy_mlp.py"),
                                          ("checkup", "nan/healthy_mlp.py")])
def test_cpu_healthy_fixtures_on_cuda_raise_nothing(probe, script):
    """Also: a script that sets CUDA as the default device does not break the instruments'
    own host buffers (the first version's pinned row buffer raised inside the script)."""
    import torch

    torch.set_default_device("cuda")
    try:
        rep = judge(probe, SCRIPTS / script)
    finally:
        torch.set_default_device(None)
    assert codes(rep) == set(), [(f.code, f.title) for f in rep.findings]
