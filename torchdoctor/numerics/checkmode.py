"""Name the first op whose output turns non-finite while its inputs are finite.

``FirstNonFinite`` is a ``TorchDispatchMode``: every aten op run while it is entered is checked
(one device sync per op: use it only around one module call of one step, in a re-run). The
inputs are checked *before* the op runs (an in-place op overwrites them), the outputs after;
-Inf made by mask ops (masked_fill, full, where ...) is taken as deliberate (see the class).
Ops without a floating-point tensor input (factories) and ``empty*`` ops (uninitialised memory)
are not candidates. The first hit records the op, the user's frames at that moment, and exact
stats of its inputs and outputs.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.numerics.names import source_line, user_stack
from torchdoctor.numerics.tensors import as_real, exact_stats, float_tensors


MASK_OPS = ("masked_fill", "fill", "full", "where", "index_fill", "index_put", "masked_scatter")


def _state(ts: list) -> str:
    """'ok' (all finite), 'neg' (-Inf present, no NaN/+Inf) or 'bad' (NaN or +Inf present)."""
    import torch

    if not ts:
        return "ok"
    flags = []
    for t in ts:
        d = as_real(t.detach())
        flags.append(torch.stack([torch.isnan(d).any(), torch.isposinf(d).any(), torch.isneginf(d).any()]))
    nan, pos, neg = torch.stack(flags).any(dim=0).tolist()
    return "bad" if (nan or pos) else ("neg" if neg else "ok")


def make_mode():
    """A fresh FirstNonFinite mode (the class is built lazily: it needs torch)."""
    from torchdoctor.runner.patching import passthrough
    from torchdoctor.torch_internals import dispatch_mode_base

    TorchDispatchMode = dispatch_mode_base()

    class FirstNonFinite(TorchDispatchMode):
        """Finds the first op whose inputs are finite and whose output is not.

        -Inf written by a mask-making op (``masked_fill``, ``full``, ``where``...) is taken as
        deliberate: the search goes on, allowing -Inf in inputs, for an op that makes NaN or
        +Inf (the softmax of a fully masked row).
        """

        def __init__(self) -> None:
            super().__init__()
            self.found: dict[str, Any] | None = None
            self.masks: list[str] = []
            self.ops_checked = 0

        @passthrough  # runs the user's op: its errors are the user's (runner/frames.py)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.found is not None:
                return func(*args, **kwargs)
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            ins = _flat_float(args, kwargs)
            if not ins or "empty" in name:
                return func(*args, **kwargs)
            before = _state(ins)
            in_stats = [exact_stats(t) for t in ins[:4]] if before != "bad" else None
            out = func(*args, **kwargs)
            if before == "bad":
                return out
            self.ops_checked += 1
            outs = float_tensors(out)
            after = _state(outs) if outs else "ok"
            hit = (after == "bad") or (after == "neg" and before == "ok")
            if not hit:
                return out
            stack = user_stack(limit=8, skip=2)
            if after == "neg" and any(m in name for m in MASK_OPS):
                self.masks.append(f"aten::{name} at {stack[0] if stack else '?'}")
                return out
            self.found = {
                "op": f"aten::{name}",
                "overload": str(func),
                "where": stack[0] if stack else None,
                "code": source_line(stack[0]) if stack else None,
                "user_stack": stack,
                "inputs": in_stats,
                "outputs": [exact_stats(t) for t in outs[:4]],
            }
            if self.masks:
                self.found["masks_before"] = self.masks[:3]
            module_of = getattr(self, "module_of", None)  # set by a caller that tracks modules
            if module_of is not None:
                self.found["in_module"] = module_of()
            return out

    return FirstNonFinite()


def _flat_float(args: tuple, kwargs: dict) -> list:
    out = float_tensors(list(args), limit=16)
    if kwargs:
        out += float_tensors(kwargs, limit=8)
    return out
