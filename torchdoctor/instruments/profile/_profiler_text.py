"""Reading names and inputs of torch.profiler events as plain data (for ``_profiler_compat``).

Profiler names are C++ strings that may not be valid UTF-8; op inputs are ``sizes``/``dtype``
records (``record_shapes``), a c10d op's first input a list of them.
"""

from __future__ import annotations

from typing import Any, Callable


def _text(get: Callable[[], Any]) -> str:
    """A name from the profiler as text, whatever its bytes: pybind turns the C++ ``std::string``
    into ``str`` with a strict UTF-8 decode, so a kernel or op name that is not valid UTF-8 (a
    demangled template, a name cut inside a character) raises ``UnicodeDecodeError`` on access.
    The error carries the raw bytes: they are decoded again with replacement (U+FFFD)."""
    try:
        v = get()
    except UnicodeDecodeError as e:
        raw = e.object
        return bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray, memoryview)) else "\ufffd"
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return "" if v is None else str(v)


def _dtype_name(dt: Any) -> str:
    s = _text(lambda: str(dt))
    return s[6:] if s.startswith("torch.") else s


def _op_inputs(ef: Any) -> list:
    """[[dtype, numel] | None] per input of a TorchOp (record_shapes must be on)."""
    out: list = []
    try:
        inputs = ef.inputs
    except Exception:  # noqa: BLE001
        return out
    for i in inputs[:4]:
        sizes = getattr(i, "sizes", None)
        dtype = getattr(i, "dtype", None)
        if sizes is None or dtype is None:
            out.append(None)
            continue
        n = 1
        for s in sizes:
            n *= int(s)
        out.append([_dtype_name(dtype), n])
    return out


def _op_shapes(ef: Any) -> list:
    """[sizes | None] of a TorchOp's first three inputs (matmul ops: their M, N, K)."""
    out: list = []
    try:
        inputs = ef.inputs
    except Exception:  # noqa: BLE001
        return out
    for i in inputs[:3]:
        sizes = getattr(i, "sizes", None)
        try:
            out.append([int(x) for x in sizes] if sizes is not None and len(sizes) <= 4 else None)
        except (TypeError, ValueError):
            out.append(None)
    return out


def _list_input(ef: Any) -> list | None:
    """[dtype, total numel] of a TorchOp's first input when it is a list of tensors (c10d ops)."""
    try:
        first = ef.inputs[0]
    except Exception:  # noqa: BLE001
        return None
    if not isinstance(first, (list, tuple)) or not first:
        return None
    dtype, n = None, 0
    for t in first:
        sizes, dt = getattr(t, "sizes", None), getattr(t, "dtype", None)
        if sizes is None or dt is None:
            return None
        dtype = dtype or _dtype_name(dt)
        k = 1
        for s in sizes:
            k *= int(s)
        n += k
    return [dtype, n]
