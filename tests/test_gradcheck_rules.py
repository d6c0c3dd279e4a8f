"""The gradcheck rules on synthetic evidence (no torch, no child process)."""

from __future__ import annotations

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.judge import judge

FN = {"kind": "autograd_function", "function": "Gate", "inputs": ["x", "gate"], "calls": 10,
      "graph_calls": 10, "sampled": 2, "skipped": {}, "forward_at": "/w/train.py:10",
      "backward_at": "/w/train.py:15"}
SUMMARY = {"kind": "gradcheck_summary", "sampled": 2, "checked": 2, "seconds": 1.0, "budget_s": 60.0,
           "capture": "Function.apply", "functions": 1}


def ok_input(arg, **kw):
    base = {"arg": arg, "shape": [4, 8], "elements": 32, "compared": 32, "sampled": False, "beyond": 0,
            "kinks": 0, "imprecise": 0, "confirmed": 0, "max_numerical": 2.0, "max_analytical": 2.0,
            "numerical_zero": False, "gradcheck": {"passed": True}}
    return {**base, **kw}


def wrong_input(arg, **kw):
    base = dict(beyond=32, confirmed=32, max_abs_error=1.5, max_rel_error=0.5,
                worst={"index": [3, 1], "analytical": 1.5, "numerical": 3.0, "abs_error": 1.5,
                       "rel_error": 0.5},
                gradcheck={"passed": False, "message": "Jacobian mismatch"})
    return ok_input(arg, **{**base, **kw})


def call(inputs, n=1, **kw):
    return {"kind": "gradcheck_call", "function": "Gate", "status": "checked", "call": n,
            "call_site": "/w/train.py:40", "backward_at": "/w/train.py:15", "input_names": ["x", "gate"],
            "shapes": [[64, 8], [8]], "inputs": inputs, **kw}


def run(events):
    report = Report(command="gradcheck")
    judge("gradcheck", Evidence.from_events(events), report)
    return report


def codes(report):
    return sorted(f"{f.code}@{f.severity}" for f in report.findings)


def test_a_wrong_input_is_named_and_the_correct_one_is_not_blamed():
    r = run([FN, call([ok_input(0), wrong_input(1)]), call([ok_input(0), wrong_input(1)], n=2), SUMMARY])
    assert codes(r) == ["custom-gradient-mismatch@error"]
    f = r.findings[0]
    assert f.evidence["wrong_inputs"] == ["gate (input 1)"]
    assert f.evidence["correct_inputs"] == ["x (input 0)"]
    assert f.evidence["worst_element"] == {"input": "gate (input 1)", "index": [3, 1], "analytical": 1.5,
                                           "numerical": 3.0}
    assert "gate (input 1)" in f.title and "x (input 0) is correct" in f.title and "2 of 2" in f.title
    assert f.evidence["backward_at"].endswith("train.py:15")


def test_correct_on_some_calls_and_wrong_on_others_says_which():
    r = run([FN, call([ok_input(0), ok_input(1)], n=1), call([ok_input(0), wrong_input(1)], n=7), SUMMARY])
    f = r.findings[0]
    assert "1 of 2 checked calls" in f.title
    assert f.evidence["wrong_on"][0].startswith("call 7") and f.evidence["correct_on"][0].startswith("call 1")


def test_all_correct_raises_nothing():
    r = run([FN, call([ok_input(0), ok_input(1)]), SUMMARY])
    assert codes(r) == []


@pytest.mark.parametrize("why", [
    {"kinks": 30, "beyond": 30},  # ReLU on exact zeros: no finding
    {"imprecise": 30, "beyond": 30},  # float32 inside: rounding, not confirmed at the larger step
])
def test_kinks_and_rounding_are_not_mismatches(why):
    r = run([FN, call([ok_input(0, gradcheck={"passed": False, "message": "m"}, **why), ok_input(1)]), SUMMARY])
    assert codes(r) == []


def test_a_gradcheck_pass_overrides_the_projection():
    r = run([FN, call([wrong_input(0, gradcheck={"passed": True}), ok_input(1)]), SUMMARY])
    assert codes(r) == []


def test_a_straight_through_estimator_is_info_only():
    ste = wrong_input(0, numerical_zero=True, forward_varies=True, max_numerical=0.0)
    r = run([FN, call([ste]), call([ste], n=2), SUMMARY])
    assert codes(r) == ["custom-function-surrogate-gradient@info"]


def test_an_input_the_output_does_not_depend_on_is_a_mismatch_not_a_surrogate():
    ghost = wrong_input(1, numerical_zero=True, forward_varies=False, max_numerical=0.0)
    r = run([FN, call([ok_input(0), ghost]), SUMMARY])
    assert codes(r) == ["custom-gradient-mismatch@error"]


def test_double_backward_mismatch_is_a_warning_when_first_order_is_right():
    r = run([FN, call([ok_input(0), ok_input(1)], gradgradcheck={"run": True, "passed": False,
                                                                 "message": "Jacobian mismatch for output 0"}),
             SUMMARY])
    assert codes(r) == ["custom-gradient-mismatch@warning"]
    assert "double backward" in r.findings[0].title


def test_bad_return_is_classified_with_the_inputs_named():
    err = "RuntimeError: function GateBackward returned an incorrect number of gradients (expected 2, got 1)"
    r = run([FN, call([], status="backward-error", error=err), SUMMARY])
    assert codes(r) == ["custom-function-bad-grad-return@error"]
    assert "1 returned for 2 forward inputs (x, gate)" in r.findings[0].title
    assert any(s.rule == "custom-gradient-mismatch" and "backward raised" in s.reason for s in r.skipped)


def test_shape_return_names_the_input():
    err = ("RuntimeError: Function GateBackward returned an invalid gradient at index 1 - got [64, 8] but "
           "expected shape compatible with [8]")
    r = run([FN, call([], status="backward-error", error=err), SUMMARY])
    assert "gate (input 1) got [64, 8], its input is [8]" in r.findings[0].title


def test_an_unclassified_backward_error_is_not_a_finding():
    r = run([FN, call([], status="backward-error", error="RuntimeError: expected scalar type Float"), SUMMARY])
    assert codes(r) == []


def test_no_custom_function_is_not_applicable_not_healthy():
    r = run([SUMMARY])
    assert codes(r) == []
    assert {s.rule for s in r.skipped} >= {"custom-gradient-mismatch", "custom-function-dirty-input"}


def test_calls_that_could_not_be_checked_say_why():
    r = run([FN, call([], status="skipped", reason="the forward fails in float64: RuntimeError: x"), SUMMARY])
    skip = {s.rule: s.reason for s in r.skipped}
    assert "forward fails in float64" in skip["custom-gradient-mismatch"]


def test_dirty_input_and_ctx_tensors():
    dirty = {"kind": "autograd_dirty", "function": "Gate", "arg": 0, "shape": [4], "requires_grad": True,
             "leaf": True, "call_site": "/w/train.py:40", "forward_at": "/w/train.py:10", "call": 1}
    ctx_io = {"kind": "autograd_ctx_tensors", "function": "Gate", "call": 1,
              "attrs": [{"name": "out", "shape": [4], "dtype": "float32", "role": "output 0"}]}
    ctx_mid = {"kind": "autograd_ctx_tensors", "function": "Other", "call": 1,
               "attrs": [{"name": "mask", "shape": [4], "dtype": "bool", "role": "intermediate"}]}
    r = run([FN, dirty, ctx_io, ctx_mid, SUMMARY])
    assert codes(r) == ["custom-function-ctx-tensors@info", "custom-function-ctx-tensors@warning",
                        "custom-function-dirty-input@warning"]
    d = next(f for f in r.findings if f.code == "custom-function-dirty-input")
    assert "x (input 0)" in d.title and "leaf" in d.title
    w = next(f for f in r.findings if f.severity == "warning" and f.code == "custom-function-ctx-tensors")
    assert "reference cycle" in w.title


def test_opcheck_schema_failure_is_a_warning_fake_only_is_info():
    op = {**FN, "function": "lib::op", "is_op": True}
    bad_schema = call([ok_input(0)], opcheck={"test_schema": "RuntimeError: Argument x is not defined as "
                                                             "mutable but was mutated",
                                              "test_autograd_registration": "SUCCESS",
                                              "test_faketensor": "SUCCESS"})
    no_fake = call([ok_input(0)], n=2, opcheck={"test_schema": "SUCCESS", "test_autograd_registration": "SUCCESS",
                                                "test_faketensor": "RuntimeError: no fake impl"})
    r = run([op, bad_schema, no_fake, SUMMARY])
    assert codes(r) == ["custom-op-check-failed@info", "custom-op-check-failed@warning"]
    assert "test_schema" in next(f for f in r.findings if f.severity == "warning").title
    r = run([FN, call([ok_input(0)]), SUMMARY])
    assert any(s.rule == "custom-op-check-failed" and "no torch.library custom op" in s.reason for s in r.skipped)


def test_misuse_inside_a_library_function_is_info_only():
    dirty = {"kind": "autograd_dirty", "function": "LibFn", "arg": 0, "shape": [4], "requires_grad": True,
             "leaf": False, "call": 1, "user_code": False}
    ctx_io = {"kind": "autograd_ctx_tensors", "function": "LibFn", "call": 1, "user_code": False,
              "attrs": [{"name": "x", "shape": [4], "dtype": "float32", "role": "input 0"}]}
    r = run([FN, dirty, ctx_io, SUMMARY])
    assert codes(r) == ["custom-function-ctx-tensors@info", "custom-function-dirty-input@info"]


def test_a_none_gradient_for_an_input_that_requires_grad_is_said():
    r = run([FN, call([ok_input(0), wrong_input(1, returned_none=True)]), SUMMARY])
    assert "backward returns None for it" in r.findings[0].title


def test_checks_that_could_not_run_say_why():
    r = run([FN, {**SUMMARY, "checked": 0, "error": "RuntimeError: CUDA error: device-side assert"}])
    assert codes(r) == []
    assert any("could not run after the script: RuntimeError: CUDA" in s.reason for s in r.skipped)
