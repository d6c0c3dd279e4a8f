"""The NaN monitor in every dtype a model trains in (issue 13 item 2).

float64 gradients made ``torch._foreach_norm(..., dtype=float32)`` raise (torch will not
narrow Double), so every float64 run had an ``internal-error`` and no watch, and the ``nan``
probe blamed the loss for a NaN that came in with the input. Complex parameters failed the
same way; complex activations were not watched at all. Each dtype must give the float32
twin's diagnosis, and a healthy run no finding.
"""

from __future__ import annotations

import pytest
from test_nan_fixtures import SCRIPTS, by_code, codes, judge

DTYPES = ["float32", "float64", "bfloat16", "float16"]
# a pure float16 model trained without a GradScaler is itself a finding (not a NaN one)
EXPECTED_EXTRA = {"float16": {"fp16-without-scaler"}}


def _internal(rep) -> list:
    return [(f.code, f.title) for f in rep.findings if f.code == "internal-error"]


@pytest.mark.parametrize("probe", ["nan", "checkup"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_healthy_model_in_any_dtype_raises_nothing(dtype, probe):
    rep = judge(probe, SCRIPTS / "nan/dtype_mlp.py", (dtype, "none"))
    assert not _internal(rep)
    assert codes(rep) == EXPECTED_EXTRA.get(dtype, set()), [(f.code, f.title) for f in rep.findings]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fault,step,module,title", [
    ("input", 4, "model", "the input of model (Sequential) already holds NaN at step 4"),  # not the loss
    ("module", 6, "model.0", "at step 6: output of model.0 (Standardize)"),
])
def test_sick_model_in_any_dtype_is_diagnosed_like_float32(dtype, fault, step, module, title):
    rep = judge("nan", SCRIPTS / "nan/dtype_mlp.py", (dtype, fault))
    assert not _internal(rep)
    assert codes(rep) == {"nonfinite-forward"} | EXPECTED_EXTRA.get(dtype, set()), \
        [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == step and f.evidence["module"] == module
    assert title in f.title


def test_float64_grad_norm_beyond_float32_range_is_not_a_nan():
    """A float64 loss / gradient norm above 3.4e38 is finite: it must not read back as Inf."""
    import torch

    from torchdoctor.numerics.tensors import grad_norms

    g = [torch.full((4,), 1e100, dtype=torch.float64), torch.ones(3, dtype=torch.bfloat16),
         torch.ones(2, dtype=torch.complex64), torch.ones(2)]
    ns = grad_norms(g)
    assert [n.dtype for n in ns] == [torch.float64, torch.float32, torch.float32, torch.float32]
    assert torch.isfinite(torch.stack(ns)).all()
    assert all(n.dtype == torch.float64 for n in grad_norms(g, wide=True))


@pytest.mark.parametrize("probe", ["nan", "checkup"])
def test_complex_parameters_are_watched(probe):
    rep = judge(probe, SCRIPTS / "nan/spectral.py", ("none",))
    assert not _internal(rep) and codes(rep) == set(), [(f.code, f.title) for f in rep.findings]


def test_nan_made_in_a_complex_module_is_named():
    rep = judge("nan", SCRIPTS / "nan/spectral.py", ("module",))
    assert not _internal(rep)
    assert codes(rep) == {"nonfinite-forward"}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == 5 and f.evidence["module"] == "model.0"
    assert f.evidence["module_class"] == "SpectralGain"
    assert f.evidence.get("op") == "aten::div"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fault", ["none", "input"])
def test_cuda_rows_in_any_dtype(dtype, fault):
    """On CUDA the rows are reduced with the fused kernels and read back asynchronously
    through pinned float64 slots (numerics/hostread.py)."""
    rep = judge("nan", SCRIPTS / "nan/dtype_mlp.py", (dtype, fault, "cuda"))
    assert not _internal(rep)
    want = EXPECTED_EXTRA.get(dtype, set()) | ({"nonfinite-forward"} if fault == "input" else set())
    assert codes(rep) == want, [(f.code, f.title) for f in rep.findings]
    if fault == "input":
        f = by_code(rep, "nonfinite-forward")
        assert f.evidence["step"] == 4 and f.evidence["module"] == "model"
