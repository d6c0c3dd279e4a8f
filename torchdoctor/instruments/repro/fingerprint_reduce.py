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

Bounded: the float64 copy is made ``CHUNK`` elements at a time (a 1-billion-element float32
tensor would otherwise need an 8 GB float64 copy on its device for one fingerprint). A tensor
the instruments must not read (sparse, nested, meta, quantized, DTensor and other wrapper
subclasses: ``torchdoctor/memory/layouts.py``) has no fingerprint: ``reduce3`` returns None and
the caller counts it.
"""

from __future__ import annotations

from typing import Any, Iterator

STRIDE = 7
CHUNK = 1 << 22  # elements converted to float64 at a time (32 MiB of float64)
MAX_LEAVES = 16  # tensors taken from one nested batch / output structure


def reduce3(torch: Any, t: Any) -> Any:
    """``[sum, sum of squares, strided sum]`` in float64 on ``t``'s device; None for a tensor of a
    layout that is not read (module doc)."""
    from torchdoctor.memory.layouts import unsupported

    if unsupported(t) is not None:
        return None
    d = t.detach()
    if d.is_complex():
        d = torch.view_as_real(d)
    x = d.reshape(-1)
    n = x.numel()
    if n == 0:
        return torch.zeros(3, dtype=torch.float64, device=x.device)
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if n <= CHUNK:
        x = x.to(torch.float64)
        return torch.stack([x.sum(), torch.dot(x, x), x[::STRIDE].sum()])
    acc = torch.zeros(3, dtype=torch.float64, device=x.device)
    for o in range(0, n, CHUNK):
        c = x[o:o + CHUNK].to(torch.float64)
        acc += torch.stack([c.sum(), torch.dot(c, c), c[(-o) % STRIDE::STRIDE].sum()])
    return acc


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
