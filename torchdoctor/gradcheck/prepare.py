"""A captured call made ready for checking: float64 copies on the call's device, the sub-problem.

Every floating-point tensor argument becomes float64 (integer and boolean ones keep their dtype)
on the device the call ran on; the arguments that required grad in the real call are the inputs
whose gradients are checked, the others are constants. The **sub-problem** slices the leading
dimension of every top-level tensor argument that shares the first checked input's leading size,
so that no checked input has more than ``SUB_ELEMENTS`` elements: a batch of fewer rows is still a
valid input of the same Function, and a backward that is wrong is wrong on a few rows too. When
the Function rejects the slice (its forward raises), the whole call is checked instead (then the
comparison samples elements).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.gradcheck.limits import SUB_ELEMENTS


def to64(torch, a: Any, device: Any, depth: int = 0) -> Any:
    if isinstance(a, torch.Tensor):
        t = a.to(device)
        return t.to(torch.float64) if t.is_floating_point() else t
    if depth < 2 and isinstance(a, (list, tuple)):
        items = [to64(torch, x, device, depth + 1) for x in a]
        try:
            return type(a)(items) if not hasattr(a, "_fields") else type(a)(*items)
        except TypeError:
            return list(items)
    if depth < 2 and isinstance(a, dict):
        return {k: to64(torch, v, device, depth + 1) for k, v in a.items()}
    return a


def checked_inputs(torch, args: list, requires: list[bool]) -> list[int]:
    return [i for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and i < len(requires) and requires[i] and a.is_floating_point()]


def sub_problem(torch, args: list, diff: list[int],
                target: int = SUB_ELEMENTS) -> tuple[list, dict[str, Any] | None]:
    """(sliced args, {"dim0": [from, to]}) or (args, None) when nothing needs slicing."""
    first = args[diff[0]]
    if first.dim() < 1 or first.shape[0] < 2:
        return args, None
    lead = int(first.shape[0])
    shared = [i for i in diff if args[i].dim() >= 1 and args[i].shape[0] == lead]
    per_row = max(args[i].numel() // lead for i in shared)
    if max(args[i].numel() for i in diff) <= target:
        return args, None
    keep = max(1, target // max(1, per_row))
    if keep >= lead:
        return args, None
    out = [a[:keep] if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == lead else a
           for a in args]
    return out, {"dim0": [lead, keep]}
