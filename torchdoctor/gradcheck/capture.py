"""Bounded copies of real calls of a custom Function, and the book that keeps a few per Function.

A call is copied *before* its forward runs (a forward may modify its inputs in place): every
tensor argument is detached and copied to the host (``.to("cpu", copy=True)``: no device memory
is taken from the training, one device sync per copied call), tensors inside a list/tuple/dict
argument too; other arguments are kept by reference. A call larger than ``CALL_BYTES`` is copied
as a slice of its leading dimension (the rows of every tensor argument that shares the first
differentiable input's leading size) small enough to fit, and says so (``reduced``).

Only calls that build a graph are sampled (grad mode on and a floating-point input that
requires grad): the others have no gradient to check. The book keeps ``samples`` calls per
Function, preferring distinct input signatures (shapes, dtypes, requires_grad): a call with a
new signature replaces a kept call whose signature is kept twice.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.gradcheck.limits import CALL_BYTES, SAMPLES_PER_FUNCTION, TOTAL_BYTES


def _is_plain_tensor(torch, a: Any) -> bool:
    return isinstance(a, torch.Tensor) and (type(a) is torch.Tensor or type(a) is torch.nn.Parameter) \
        and a.layout == torch.strided and not a.is_quantized and a.device.type != "meta"


def signature(torch, args: tuple) -> tuple:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), str(a.dtype), bool(a.requires_grad)))
        else:
            out.append(type(a).__name__)
    return tuple(out)


def checkable(torch, args: tuple) -> bool:
    """Grad mode on and a floating-point tensor argument that requires grad."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad and a.is_floating_point() for a in args)


def _nbytes(torch, a: Any, depth: int = 0) -> int | None:
    """Bytes to copy for ``a`` (None: a tensor that cannot be copied plainly)."""
    if isinstance(a, torch.Tensor):
        return a.numel() * a.element_size() if _is_plain_tensor(torch, a) else None
    if depth < 2 and isinstance(a, (list, tuple)):
        total = 0
        for x in a:
            n = _nbytes(torch, x, depth + 1)
            if n is None:
                return None
            total += n
        return total
    if depth < 2 and isinstance(a, dict):
        return _nbytes(torch, list(a.values()), depth)
    return 0


def _copy(torch, a: Any, rows: tuple[int, int] | None, depth: int = 0) -> Any:
    if isinstance(a, torch.Tensor):
        t = a.detach()
        if rows is not None and t.dim() >= 1 and t.shape[0] == rows[0]:
            t = t[: rows[1]]
        return t.to("cpu", copy=True)
    if depth < 2 and isinstance(a, (list, tuple)):
        items = [_copy(torch, x, rows, depth + 1) for x in a]
        try:
            return type(a)(items) if not hasattr(a, "_fields") else type(a)(*items)
        except TypeError:
            return list(items)
    if depth < 2 and isinstance(a, dict):
        return {k: _copy(torch, v, rows, depth + 1) for k, v in a.items()}
    return a


def _leading(torch, args: tuple) -> int | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad and a.dim() >= 1 and a.is_floating_point():
            return int(a.shape[0])
    return None


def copy_call(torch, args: tuple, room: int) -> dict[str, Any] | None:
    """{"args", "bytes", "reduced"} or {"skip": reason}; ``room``: bytes still allowed in all."""
    total = 0
    for a in args:
        n = _nbytes(torch, a)
        if n is None:
            return {"skip": "an argument is a tensor subclass, a sparse, quantized or meta tensor"}
        total += n
    limit = min(CALL_BYTES, room)
    rows = None
    if total > limit:
        lead = _leading(torch, args)
        if not lead or lead < 2:
            return {"skip": f"inputs of {total} bytes, over the copy bound, with no leading dim to slice"}
        share = sum(_nbytes(torch, a) or 0 for a in args
                    if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == lead)
        rest = total - share
        per_row = max(1, share // lead)
        keep = (limit - rest) // per_row
        if keep < 1:
            return {"skip": f"inputs of {total} bytes, over the copy bound even as one row"}
        rows = (lead, int(min(lead, keep)))
        total = rest + per_row * rows[1]
    copied = [_copy(torch, a, rows) for a in args]
    return {"args": copied, "bytes": int(total),
            "reduced": None if rows is None else {"dim0": [rows[0], rows[1]], "at": "capture"}}


class SampleBook:
    """Per Function: the kept calls (``samples`` at most), and what was seen."""

    def __init__(self, samples: int = SAMPLES_PER_FUNCTION, total_bytes: int = TOTAL_BYTES):
        self.samples = max(1, int(samples))
        self.total_bytes = total_bytes
        self.bytes = 0
        self.kept: dict[Any, list[dict[str, Any]]] = {}
        self.skipped: dict[Any, dict[str, int]] = {}

    def room(self) -> int:
        return max(0, self.total_bytes - self.bytes)

    def wants(self, key: Any, sig: tuple) -> int | None:
        """Where a call of ``sig`` would go: an index to replace, len(kept) to append, None."""
        kept = self.kept.get(key, [])
        if len(kept) < self.samples:
            return len(kept)
        sigs = [k["sig"] for k in kept]
        if sig in sigs:
            return None
        for i in range(len(kept) - 1, -1, -1):
            if sigs.count(sigs[i]) > 1:
                return i
        return None

    def put(self, key: Any, where: int, record: dict[str, Any]) -> None:
        kept = self.kept.setdefault(key, [])
        if where < len(kept):
            self.bytes -= kept[where].get("bytes", 0)
            kept[where] = record
        else:
            kept.append(record)
        self.bytes += record.get("bytes", 0)

    def skip(self, key: Any, reason: str) -> None:
        d = self.skipped.setdefault(key, {})
        d[reason] = d.get(reason, 0) + 1
