"""Where an error was raised decides whose problem it is (issue 13, item 13).

Fixtures are pasted tracebacks written in the shape torch 2.13 prints them (checked against real
runs): an in-place error raised while a custom autograd.Function's backward reads
``ctx.saved_tensors``, and a leaf in-place error raised in a weight-init function.
"""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from torchdoctor.triage.matcher import triage
from torchdoctor.triage.symptoms import AG, DBG, MOD

FIX = FIXTURES / "ask"


def _routes(a):
    return [r.skill for r in a.routes]


def test_inplace_error_in_a_custom_function_backward_routes_custom_autograd_first():
    a = triage((FIX / "tb_inplace_custom_function.txt").read_text(), source="stdin")
    assert _routes(a)[:2] == [AG, DBG]
    assert a.decisive.id == "inplace-modified-custom-function" and a.decisive.skill == AG
    assert a.decisive.where == "/home/user/project/fused_ops.py:31 in backward"
    assert "save_for_backward" in a.decisive.explain and "gradcheck" in a.decisive.first_step
    assert "custom autograd.Function" in a.routes[0].why and "fused_ops.py:31" in a.routes[0].why


def test_ordinary_inplace_error_still_routes_debugging_first():
    a = triage((FIX / "tb_inplace.txt").read_text(), source="stdin")
    assert _routes(a)[:2] == [DBG, AG] and a.decisive.id == "inplace-modified"


@pytest.mark.parametrize("name, fn", [("tb_leaf_inplace_init_weights.txt", "init_weights"),
                                      ("tb_leaf_inplace_init_method.txt", "_init_weights")])
def test_leaf_inplace_in_a_weight_init_function_routes_module_design(name, fn):
    a = triage((FIX / name).read_text(), source="stdin")
    assert _routes(a)[0] == MOD and a.decisive.id == "leaf-inplace-weight-init"
    assert a.decisive.where.endswith(f"in {fn}") and "nn.init" in a.decisive.first_step
    assert f"{fn}()" in a.routes[0].why


def test_leaf_inplace_in_a_manual_update_stays_debugging():
    a = triage((FIX / "tb_leaf_inplace_update.txt").read_text(), source="stdin")
    assert _routes(a) == [DBG] and a.decisive.id == "leaf-inplace"


def test_pasted_code_with_the_error_is_evidence_too():
    a = triage("I get RuntimeError: a leaf Variable that requires grad is being used in an in-place "
               "operation. from def init_weights(m): m.weight.fill_(0.01)")
    assert _routes(a)[0] == MOD
    a = triage("class MyGelu(torch.autograd.Function): ... def backward(ctx, g): x, = ctx.saved_tensors ... "
               "RuntimeError: one of the variables needed for gradient computation has been modified by an "
               "inplace operation: [torch.FloatTensor [4]], which is output 0 of MyGelu, is at version 1; "
               "expected version 0 instead.")
    assert _routes(a)[0] == AG
    a = triage("RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.")
    assert _routes(a) == [DBG]


def test_a_backward_frame_of_torch_itself_is_not_a_custom_function():
    """`loss.backward()` goes through torch/_tensor.py `backward`: a library frame, not the user's."""
    tb = (FIX / "tb_inplace.txt").read_text().replace('in _inplace', 'in backward')
    a = triage(tb, source="stdin")
    assert _routes(a)[0] == DBG  # the user frame's code is `b.sum().backward()`: no ctx, no apply frame


def test_a_helper_called_from_the_custom_backward_still_counts():
    tb = (FIX / "tb_inplace_custom_function.txt").read_text().replace(
        "    (x, out) = ctx.saved_tensors\n               ^^^^^^^^^^^^^^^^^\n",
        "    return _gelu_grad(ctx, grad_out)\n"
        '  File "/home/user/project/fused_ops.py", line 12, in _gelu_grad\n'
        "    (x, out) = ctx.saved_tensors\n")
    a = triage(tb, source="stdin")
    assert _routes(a)[0] == AG and "fused_ops.py:31 in backward" in a.routes[0].why
