"""The fingerprint of a tensor: a few float64 reductions, computed on its device, never read here.

Used by the ``repro`` instruments (``fingerprint``: per step; ``fingerprint_ops``: per op in the
localising re-run). Not an instrument (nothing is registered here).

``reduce3(t)`` is a float64 tensor ``[sum, sum of squares, strided sum]`` of ``t``'s values
(complex: real and imaginary parts as values; integers and booleans as numbers), on ``t``'s
device: the strided sum adds every ``STRIDE``-th element from the first, so a permutation or a
change in a few elements that keeps the sum usually still shows. float64 accumulation of
float32/16 values: a change of one element by one unit in its last place moves the sum unless
the sum is ~2^29 times larger than that element. Read-only: the input is detached and only
read (one float64 copy, a sum, a dot product with itself, a strided sum); nothing draws from a random generator; nothing is
written to the input or to any global setting.
"""

from __future__ import annotations

from typing import Any, Iterator

STRIDE = 7
MAX_LEAVES = 16  # tensors taken from one nested batch / output structure


def reduce3(torch: Any, t: Any) -> Any:
    d = t.detach()
    if d.is_complex():
        d = torch.view_as_real(d)
    x = d.reshape(-1)
    if x.numel() == 0:
        return torch.zeros(3, dtype=torch.float64, device=x.device)
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    x = x.to(torch.float64)
    return torch.stack([x.sum(), torch.dot(x, x), x[::STRIDE].sum()])


def tensor_leaves(torch: Any, obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(label, tensor) of the tensors in a nested tuple / list / dict (``MAX_LEAVES`` at most by
    the caller), labels like ``[0]``, ``['x']``, ``.logits`` (dataclass-like outputs: their
    ``__dict__`` is not walked; a ``ModelOutput``-style dict is)."""
    if isinstance(obj, torch.Tensor):
        yield prefix or "", obj
        return
    if depth > 4:
        return
    if isinstance(obj, dict):
        for k in list(obj.keys())[:MAX_LEAVES]:
            yield from tensor_leaves(torch, obj[k], f"{prefix}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:MAX_LEAVES]):
            yield from tensor_leaves(torch, v, f"{prefix}[{i}]", depth + 1)


def leaves(torch: Any, obj: Any) -> list[tuple[str, Any]]:
    out = []
    for item in tensor_leaves(torch, obj):
        out.append(item)
        if len(out) >= MAX_LEAVES:
            break
    return out
