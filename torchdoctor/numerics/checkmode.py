"""Name the first op whose output turns non-finite while its inputs are finite.

``FirstNonFinite`` is a ``TorchDispatchMode``: every aten op run while it is entered is checked
(one device sync per op: use it only around one module call of one step, in a re-run). The
inputs are checked *before* the op runs (an in-place op overwrites them), the outputs after.
Ops without a floating-point tensor input (factories) and ``empty*`` ops (uninitialised memory)
are not candidates. The first hit records the op, the user's frames at that moment, and exact
stats of its inputs and outputs.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.numerics.names import source_line, user_stack
from torchdoctor.numerics.tensors import exact_stats, float_tensors


def _all_finite(ts: list) -> bool:
    import torch

    if not ts:
        return True
    flags = [torch.isfinite(t.detach()).all() for t in ts]
    return bool(torch.stack(flags).all()) if len(flags) > 1 else bool(flags[0])


def make_mode():
    """A fresh FirstNonFinite mode (the class is built lazily: it needs torch)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class FirstNonFinite(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.found: dict[str, Any] | None = None
            self.ops_checked = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if self.found is not None:
                return func(*args, **kwargs)
            name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
            ins = _flat_float(args, kwargs)
            candidate = bool(ins) and "empty" not in name
            ins_ok = candidate and _all_finite(ins)
            in_stats = [exact_stats(t) for t in ins[:4]] if ins_ok else None
            out = func(*args, **kwargs)
            if not ins_ok:
                return out
            self.ops_checked += 1
            outs = float_tensors(out)
            if outs and not _all_finite(outs):
                stack = user_stack(limit=8, skip=2)
                self.found = {
                    "op": f"aten::{name}",
                    "overload": str(func),
                    "where": stack[0] if stack else None,
                    "code": source_line(stack[0]) if stack else None,
                    "user_stack": stack,
                    "inputs": in_stats,
                    "outputs": [exact_stats(t) for t in outs[:4]],
                }
            return out

    return FirstNonFinite()


def _flat_float(args: tuple, kwargs: dict) -> list:
    out = float_tensors(list(args), limit=16)
    if kwargs:
        out += float_tensors(kwargs, limit=8)
    return out
