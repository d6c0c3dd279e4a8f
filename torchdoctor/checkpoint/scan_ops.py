"""The per-window NaN/Inf checks of ``scan.py``, with numpy (preferred) or torch.

For float32/float64 ``isfinite``; for 16/8-bit floats a bit test on the raw integers (a value is
NaN/Inf iff all its exponent bits are set, per the dtype's rule below).
"""

from __future__ import annotations

# dtype -> (numpy uint type code, exponent mask, mantissa mask, rule)
#   ieee: NaN/Inf iff exponent all ones; fn: NaN iff all bits but sign set (no Inf); fnuz: NaN iff == 0x80
BITS = {
    "float16": ("u2", 0x7C00, 0x03FF, "ieee"),
    "bfloat16": ("u2", 0x7F80, 0x007F, "ieee"),
    "complex32": ("u2", 0x7C00, 0x03FF, "ieee"),
    "float8_e5m2": ("u1", 0x7C, 0x03, "ieee"),
    "float8_e4m3fn": ("u1", 0x7F, 0x00, "fn"),
    "float8_e4m3fnuz": ("u1", 0xFF, 0x00, "fnuz"),
    "float8_e5m2fnuz": ("u1", 0xFF, 0x00, "fnuz"),
}
NATIVE = {"float32": "f4", "float64": "f8", "complex64": "f4", "complex128": "f8"}


class NumpyOps:
    """The checks with numpy (preferred: ≈ 0.1 s to import)."""

    def __init__(self):
        import numpy as np

        self.np = np
        self.name = f"numpy {np.__version__}"

    def itemsize(self, dtype: str) -> int:
        return self.np.dtype(NATIVE.get(dtype) or BITS[dtype][0]).itemsize

    def view(self, buf, dtype: str, byteorder: str):
        bo = ">" if byteorder == "big" else "<"
        if dtype in NATIVE:
            return self.np.frombuffer(buf, dtype=bo + NATIVE[dtype])
        code = BITS[dtype][0]
        return self.np.frombuffer(buf, dtype=(bo if code != "u1" else "|") + code)

    def bad(self, arr, dtype: str) -> bool:
        np = self.np
        if arr.size == 0:
            return False
        if dtype in NATIVE:
            # Fast path (≈ 1.8× isfinite().all() on a 32 MiB window, CPU box): NaN/Inf propagate
            # through a dot product, so a finite x·x proves every element finite; an overflow of
            # x·x (|x| > 1e19 in float32) only sends the window to the exact check.
            if arr.ndim == 1:
                with np.errstate(all="ignore"):
                    if np.isfinite(np.dot(arr, arr)):
                        return False
            return not bool(np.isfinite(arr).all())
        _code, exp, _mant, rule = BITS[dtype]
        if rule == "fnuz":
            return bool((arr == 0x80).any())
        return int(np.bitwise_and(arr, exp).max()) == exp

    def count(self, arr, dtype: str) -> tuple[int, int, int, int]:
        np = self.np
        if dtype in NATIVE:
            nan, pinf, ninf = np.isnan(arr), np.isposinf(arr), np.isneginf(arr)
        else:
            _code, exp, mant, rule = BITS[dtype]
            if rule == "fnuz":
                nan = arr == 0x80
                pinf = ninf = np.zeros(arr.shape, bool)
            else:
                e = np.bitwise_and(arr, exp) == exp
                m = np.bitwise_and(arr, mant) != 0
                nan = e & m if rule == "ieee" else e
                inf = e & ~m if rule == "ieee" else np.zeros(arr.shape, bool)
                sign = np.right_shift(arr, arr.dtype.itemsize * 8 - 1).astype(bool)
                pinf, ninf = inf & ~sign, inf & sign
        bad = nan | pinf | ninf
        first = int(np.argmax(bad)) if bad.any() else -1
        return int(nan.sum()), int(pinf.sum()), int(ninf.sum()), first

    def from_tensor(self, t, dtype: str):
        """A view of an in-memory torch tensor (``--unsafe-load``)."""
        if dtype in NATIVE:
            return t.contiguous().view(-1).numpy().view(NATIVE[dtype])
        import torch

        width = {"u2": torch.int16, "u1": torch.uint8}[BITS[dtype][0]]
        return t.contiguous().view(-1).view(width).numpy().view(self.np.dtype(BITS[dtype][0]))


# torch fallback (numpy absent): every float type checked by its bits, as signed ints
_TORCH_BITS = {  # dtype -> (bytes per value, exponent mask, mantissa mask, rule)
    "float32": (4, 0x7F800000, 0x007FFFFF, "ieee"), "complex64": (4, 0x7F800000, 0x007FFFFF, "ieee"),
    "float64": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF, "ieee"),
    "complex128": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF, "ieee"),
    **{k: ({"u2": 2, "u1": 1}[v[0]],) + v[1:] for k, v in BITS.items()},
}


class TorchOps:
    """The same checks with torch, for installs without numpy (torch does not require it)."""

    def __init__(self):
        import torch

        self.torch = torch
        self.name = f"torch {torch.__version__}"
        self.ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def itemsize(self, dtype: str) -> int:
        return _TORCH_BITS[dtype][0]

    def view(self, buf, dtype: str, byteorder: str):
        import warnings

        w = _TORCH_BITS[dtype][0]
        if len(buf) == 0:
            return self.torch.zeros(0, dtype=self.ints[w])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffers: we never write
            t = self.torch.frombuffer(buf, dtype=self.torch.uint8)
        if byteorder == "big" and w > 1:
            t = t.view(-1, w).flip(1).reshape(-1)
        return t.view(self.ints[w])

    def bad(self, t, dtype: str) -> bool:
        _w, exp, _mant, rule = _TORCH_BITS[dtype]
        if t.numel() == 0:
            return False
        if rule == "fnuz":
            return bool((t == 0x80).any())
        return bool(((t & exp) == exp).any())

    def count(self, t, dtype: str) -> tuple[int, int, int, int]:
        w, exp, mant, rule = _TORCH_BITS[dtype]
        if rule == "fnuz":
            nan = t == 0x80
            pinf = ninf = self.torch.zeros_like(nan)
        else:
            e = (t & exp) == exp
            m = (t & mant) != 0 if mant else self.torch.zeros_like(e)
            nan = e & m if rule == "ieee" else e
            inf = e & ~m if rule == "ieee" else self.torch.zeros_like(e)
            sign = (t & 0x80) != 0 if w == 1 else t < 0
            pinf, ninf = inf & ~sign, inf & sign
        bad = nan | pinf | ninf
        first = int(bad.nonzero()[0, 0]) if bool(bad.any()) else -1
        return int(nan.sum()), int(pinf.sum()), int(ninf.sum()), first

    def from_tensor(self, t, dtype: str):
        w = _TORCH_BITS[dtype][0]
        return t.contiguous().view(-1).view(self.ints[w])


def backend():
    """numpy when importable, else torch, else None (the scan is then skipped, with the reason)."""
    for cls in (NumpyOps, TorchOps):
        try:
            return cls()
        except ImportError:
            continue
    return None


