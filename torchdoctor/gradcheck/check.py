"""One captured call of a custom Function, checked in float64 on copies (never the user's tensors).

Order of work (each step may end the check with a status and the reason):

1. float64 copies on the call's device, reduced to the sub-problem (``prepare.py``);
2. forward with the checked inputs requiring grad: it must run in float64, give float64
   floating outputs (a forward that casts to float32 cannot be checked at float64 precision) and
   an output that requires grad; twice without grad, it must give the same outputs (the global
   RNG is re-seeded before every forward, so a dropout inside is fixed);
3. one backward with a random projection of the outputs (``create_graph=True``): an error here is
   recorded with torch's text classified (``returns.py``: wrong number / shape / device of
   returned gradients);
4. per checked input, the element-by-element comparison (``compare.py``) and, when the input and
   outputs are small, ``torch.autograd.gradcheck`` with the other inputs held constant;
5. ``torch.autograd.gradgradcheck`` when the backward is itself differentiable (the returned
   gradients have a graph), the first order is clean and the problem is small.

Every forward gets fresh clones of its tensor arguments, so a forward that modifies its inputs in
place is checked on the values it was called with.
"""

from __future__ import annotations

import time
from typing import Any

from torchdoctor.gradcheck.compare import compare_input
from torchdoctor.gradcheck.limits import (ATOL, EPS, GRADGRAD_ELEMENTS, RTOL, SLOW_ELEMENTS,
                                          SLOW_OUTPUTS)
from torchdoctor.gradcheck.prepare import checked_inputs, sub_problem, to64
from torchdoctor.gradcheck.returns import classify

SEED = 1234


def _text(e: BaseException, n: int = 600) -> str:
    return f"{type(e).__name__}: {str(e)[:n]}"


class _Calls:
    """Calls the Function on fresh clones, the global RNG re-seeded each time."""

    def __init__(self, torch, fn: Any, dout: list[int] | None = None):
        self.torch, self.fn, self.dout = torch, fn, dout

    def outputs(self, args: list, grad: bool = False) -> tuple:
        torch = self.torch
        torch.manual_seed(SEED)
        xs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.set_grad_enabled(grad):
            out = self.fn(*xs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    def chosen(self, args: list, grad: bool = False) -> list:
        outs = self.outputs(args, grad)
        return [outs[k] for k in self.dout]


def check_call(torch, fn: Any, rec: dict[str, Any], deadline_at: float) -> dict[str, Any]:
    """The measurements of one call (``rec`` from the sample book: args, requires, device)."""
    t0 = time.monotonic()
    out = _check(torch, fn, rec, lambda: time.monotonic() > deadline_at)
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def _check(torch, fn: Any, rec: dict[str, Any], late) -> dict[str, Any]:
    device = rec.get("device") or "cpu"
    args = [to64(torch, a, device) for a in rec["args"]]
    diff = checked_inputs(torch, args, rec["requires"])
    if not diff:
        return {"status": "skipped", "reason": "no floating-point input requires grad"}
    full = args
    args, reduced = sub_problem(torch, args, diff)
    calls = _Calls(torch, fn)
    leaves = _leaves(torch, args, diff)
    try:
        outs = calls.outputs(leaves, grad=True)
    except Exception as e:  # noqa: BLE001
        if reduced is None:
            return {"status": "skipped", "reason": f"the forward fails in float64: {_text(e, 300)}"}
        args, reduced = full, {"dim0": reduced["dim0"], "rejected": _text(e, 200)}
        leaves = _leaves(torch, args, diff)
        try:
            outs = calls.outputs(leaves, grad=True)
        except Exception as e2:  # noqa: BLE001
            return {"status": "skipped", "reason": f"the forward fails in float64: {_text(e2, 300)}"}
    res: dict[str, Any] = {"status": "checked", "reduced": reduced,
                           "checked_shapes": {str(i): list(args[i].shape) for i in diff}}
    floats = [(k, o) for k, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    low = [f"output {k}: {o.dtype}" for k, o in floats if o.dtype != torch.float64]
    if low:
        return {**res, "status": "skipped",
                "reason": "float64 inputs give lower-precision outputs (" + ", ".join(low) +
                          "): the forward computes in lower precision, so it cannot be checked "
                          "at float64 precision"}
    dout = [k for k, o in floats if o.requires_grad]
    if not dout:
        return {**res, "status": "skipped", "reason": "no output requires grad"}
    calls.dout = dout
    if not all(bool(torch.isfinite(outs[k]).all()) for k in dout):
        return {**res, "status": "skipped", "reason": "the outputs are not finite at these inputs"}
    a1, a2 = calls.chosen(args), calls.chosen(args)
    if any(not torch.equal(x, y) for x, y in zip(a1, a2)):
        return {**res, "status": "skipped", "reason": "the forward is not deterministic"}
    gen = torch.Generator().manual_seed(SEED)
    v = [torch.randn(outs[k].shape, dtype=torch.float64, generator=gen).to(outs[k].device) for k in dout]
    res["output_elements"] = sum(outs[k].numel() for k in dout)
    try:
        grads = torch.autograd.grad([outs[k] for k in dout], [leaves[i] for i in diff],
                                    grad_outputs=v, allow_unused=True, create_graph=True)
    except Exception as e:  # noqa: BLE001
        return {**res, "status": "backward-error", "error": _text(e, 1500), "returns": classify(str(e))}
    res["double_backward"] = any(g is not None and g.grad_fn is not None
                                 and "Error" not in type(g.grad_fn).__name__ for g in grads)

    def s_at_for(i: int):
        def s_at(x) -> float:
            a = list(args)
            a[i] = x
            with torch.no_grad():
                return float(sum((vk * o).sum() for vk, o in zip(v, calls.chosen(a))))
        return s_at

    def outputs_for(i: int):
        def outputs_of(x) -> list:
            a = list(args)
            a[i] = x
            with torch.no_grad():
                return calls.chosen(a)
        return outputs_of

    inputs = []
    for i, g in zip(diff, grads):
        analytic = g.detach() if g is not None else torch.zeros_like(args[i])
        one = {"arg": i, "shape": list(args[i].shape), "returned_none": g is None}
        one.update(compare_input(torch, s_at_for(i), args[i], analytic, gen, late, outputs_for(i)))
        if args[i].numel() <= SLOW_ELEMENTS and res["output_elements"] <= SLOW_OUTPUTS and not late():
            one["gradcheck"] = _gradcheck_one(torch, calls, args, leaves, i)
        inputs.append(one)
    res["inputs"] = inputs
    small = sum(args[i].numel() for i in diff) + res["output_elements"] <= GRADGRAD_ELEMENTS
    clean = all(x["beyond"] == 0 for x in inputs)
    if res["double_backward"] and not late():
        if not clean:
            res["gradgradcheck"] = {"run": False, "why": "first-order differences (or kinks) found"}
        elif not small:
            res["gradgradcheck"] = {"run": False, "why": f"more than {GRADGRAD_ELEMENTS} elements"}
        else:
            res["gradgradcheck"] = _gradgrad(torch, calls, args, leaves, diff)
    return res


def _leaves(torch, args: list, diff: list[int]) -> list:
    out = list(args)
    for i in diff:
        out[i] = args[i].detach().requires_grad_(True)
    return out


def _verdict(torch, run) -> dict[str, Any]:
    try:
        run()
        return {"passed": True}
    except Exception as e:  # noqa: BLE001
        if not _is_gradcheck_error(e):
            return {"error": _text(e, 300)}
        return {"passed": False, "message": "\n".join(str(e).splitlines()[:2])[:300]}


def _is_gradcheck_error(e: BaseException) -> bool:
    import importlib

    err = getattr(importlib.import_module("torch.autograd.gradcheck"), "GradcheckError", None)
    return err is not None and isinstance(e, err)


def _gradcheck_one(torch, calls: _Calls, args: list, leaves: list, i: int) -> dict[str, Any]:
    """torch.autograd.gradcheck (full Jacobian) of input ``i``, the other inputs constant."""

    def f(x):
        a = list(args)
        a[i] = x
        return tuple(calls.chosen(a, grad=True))

    return _verdict(torch, lambda: torch.autograd.gradcheck(
        f, (leaves[i],), eps=EPS, atol=ATOL, rtol=RTOL, check_undefined_grad=False))


def _gradgrad(torch, calls: _Calls, args: list, leaves: list, diff: list[int]) -> dict[str, Any]:
    def f(*xs):
        a = list(args)
        for i, x in zip(diff, xs):
            a[i] = x
        return tuple(calls.chosen(a, grad=True))

    out = _verdict(torch, lambda: torch.autograd.gradgradcheck(
        f, tuple(leaves[i] for i in diff), eps=EPS, atol=ATOL, rtol=RTOL,
        check_undefined_grad=False))
    return {"run": True, **out}
