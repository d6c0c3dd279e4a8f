"""Tensors inside nested outputs, and exact statistics of one tensor (for evidence).

``float_tensors`` is on the hot path of the forward watch (called for every module call), so
it handles the common shapes (a tensor, a tuple/list, a dict) without recursion into anything
else and stops after ``limit`` tensors.
"""

from __future__ import annotations

import math
from typing import Any

MAX_TENSORS_PER_CALL = 8


def float_tensors(obj: Any, limit: int = MAX_TENSORS_PER_CALL) -> list:
    """Dense floating-point or complex tensors in ``obj`` (a tensor, or one/two levels of
    tuple/list/dict). A DTensor (tensor parallelism, FSDP2) is given as this rank's local shard:
    checked where it lives, without a collective."""
    Tensor, ok = _kit()
    if isinstance(obj, Tensor):
        if type(obj) is not Tensor:
            obj = _local(obj)
        return [obj] if ok(obj) else []
    out: list = []
    if isinstance(obj, (tuple, list)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    else:
        return out
    for x in items:
        if isinstance(x, Tensor):
            if type(x) is not Tensor:
                x = _local(x)
            if ok(x):
                out.append(x)
        elif isinstance(x, (tuple, list)):
            out.extend(t for t in map(_local, x) if isinstance(t, Tensor) and ok(t))
        elif isinstance(x, dict):
            out.extend(t for t in map(_local, x.values()) if isinstance(t, Tensor) and ok(t))
        if len(out) >= limit:
            return out[:limit]
    return out


def _local(x: Any) -> Any:
    """A DTensor's local shard, anything else as it is (``torch_internals.local_tensor``)."""
    from torchdoctor.torch_internals import local_tensor

    return local_tensor(x)


_KIT = None


def _kit():
    """(Tensor class, predicate) bound once: torch is imported on first use, in the child."""
    global _KIT
    if _KIT is None:
        import torch

        strided = torch.strided

        def ok(t) -> bool:
            return ((t.is_floating_point() or t.is_complex()) and t.layout == strided
                    and not t.is_meta and t.numel() > 0)

        _KIT = (torch.Tensor, ok)
    return _KIT


def kept_scalar(t: Any) -> Any:
    """A detached copy of a one-element tensor that may be kept across steps without keeping
    anything else alive.

    ``t.detach()`` shares ``t``'s storage, and a loss's storage can be far larger than the loss:
    ``mse_loss(out, y)`` returns a 0-d tensor over the whole elementwise buffer (4 MiB for a
    1024 x 1024 output on torch 2.13 CPU; 16 MiB a step on the H200 MLP of the GPU-truth issue).
    Keeping one such view per step was a leak that torchdoctor made and then blamed on the
    user's loss line. A tensor whose storage holds exactly its one element is kept as is (no
    kernel); any other one (a larger storage, a non-strided layout) is cloned: one tiny copy,
    no sync."""
    d = t.detach()
    try:
        if d.layout is _strided() and d.untyped_storage().nbytes() <= d.element_size():
            return d
    except Exception:  # noqa: BLE001 - a subclass or layout without a storage: copy it
        pass
    return d.clone()


def _strided():
    import torch

    return torch.strided


def as_real(t: Any) -> Any:
    """A complex tensor seen as a real one (its real and imaginary parts side by side, a
    view unless its conjugate bit must be resolved); any other tensor unchanged. A complex
    value is finite iff both parts are."""
    if t.is_complex():
        import torch

        return torch.view_as_real(t.resolve_conj())
    return t


def norm_dtype(dtype: Any, wide: bool = False) -> Any:
    """The ``dtype`` argument of ``torch._foreach_norm`` / ``vector_norm`` for tensors of
    ``dtype``: float32 accumulation for float32 and narrower floats (float16, bfloat16: the
    norm of finite values cannot overflow there), the tensor's own for float64 (a float32
    accumulation would narrow it, which torch refuses) and for complex tensors (whose norm
    is real: float32 for complex64, float64 for complex128). ``wide``: float64 (complex128)."""
    import torch

    if dtype.is_complex:
        return torch.complex128 if wide else None
    if wide or dtype == torch.float64:
        return torch.float64
    return torch.float32


def grad_norms(grads: list, wide: bool = False) -> list:
    """The L2 norm of each tensor of ``grads`` (0-dim tensors, in order): one fused
    ``torch._foreach_norm`` per accumulation dtype (:func:`norm_dtype`), usually one call.
    The norms are float32, or float64 for float64/complex128 tensors (or all with ``wide``)."""
    from torchdoctor.torch_internals import foreach_norm

    norm = foreach_norm()
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        groups.setdefault(norm_dtype(g.dtype, wide), []).append(i)
    if len(groups) == 1:
        (dt, _idx), = groups.items()
        return list(norm(grads, 2, dtype=dt))
    out: list = [None] * len(grads)
    for dt, idx in groups.items():
        for i, n in zip(idx, norm([grads[i] for i in idx], 2, dtype=dt)):
            out[i] = n
    return out


def _num(x: float) -> float | str:
    """JSON-safe number: NaN/Inf become strings ("nan", "inf", "-inf")."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def exact_stats(t: Any) -> dict[str, Any]:
    """Exact stats of a tensor, one device sync: shape, dtype, NaN/+Inf/-Inf counts, and the
    min / max / mean over its finite elements (None when it has none)."""
    import torch

    with torch.no_grad():
        x = as_real(t.detach())
        xf = x.float() if x.element_size() < 4 else x  # float16, bfloat16, float8
        nan = torch.isnan(xf)
        posinf = torch.isposinf(xf)
        neginf = torch.isneginf(xf)
        fin = torch.isfinite(xf)
        n_fin = fin.sum()
        safe = torch.where(fin, xf, torch.zeros((), dtype=xf.dtype, device=xf.device))
        big = torch.finfo(xf.dtype).max
        mn = torch.where(fin, xf, torch.full((), big, dtype=xf.dtype, device=xf.device)).min()
        mx = torch.where(fin, xf, torch.full((), -big, dtype=xf.dtype, device=xf.device)).max()
        row = torch.stack([nan.sum().to(torch.float64), posinf.sum().to(torch.float64),
                           neginf.sum().to(torch.float64), n_fin.to(torch.float64),
                           mn.to(torch.float64), mx.to(torch.float64),
                           safe.to(torch.float64).sum()]).tolist()
    n_nan, n_pos, n_neg, n_f, mn_v, mx_v, s = row
    out: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                           "numel": int(t.numel()), "nan": int(n_nan), "inf": int(n_pos),
                           "-inf": int(n_neg)}
    if n_f > 0:
        out.update(min=_g(mn_v), max=_g(mx_v), mean=_g(s / n_f))
    else:
        out.update(min=None, max=None, mean=None)
    return out


def _g(x: float) -> float | str:
    """Round to 6 significant digits, JSON-safe."""
    x = _num(float(x))
    return float(f"{x:.6g}") if isinstance(x, float) else x


def describe(stats: dict[str, Any] | None) -> str:
    """One line for a console: 'float32[8, 16] NaN 12, Inf 0, finite in [-3.1, 4.2] mean 0.1'."""
    if not stats:
        return "?"
    shape = ", ".join(str(s) for s in stats.get("shape", []))
    bad = f"NaN {stats.get('nan', 0)}, +Inf {stats.get('inf', 0)}, -Inf {stats.get('-inf', 0)}"
    rng = ("no finite values" if stats.get("min") is None
           else f"finite in [{stats['min']}, {stats['max']}], mean {stats['mean']}")
    return f"{stats.get('dtype', '?')}[{shape}]: {bad}; {rng}"
