"""NaN/Inf scan of saved tensors, streamed from disk in bounded memory.

Storages are visited in file order through windows of ``CHUNK`` bytes, each mapped,
checked and unmapped in turn: no copy (an mmap reads the page cache in place, ≈ 2× faster
than ``preadv`` into a buffer here) and resident memory bounded by one window whatever
the checkpoint's size (keeping a whole-file mapping would count every page in RSS). The
kernel is asked to read ``AHEAD`` bytes ahead of the check (``POSIX_FADV_WILLNEED``), so
on a cold cache the disk works while numpy checks (bench/checkpoint_audit.py).

The check per window is one vectorised numpy pass: ``isfinite`` for float32/float64,
and for 16/8-bit floats (which numpy cannot compute with, or only slowly) a bit test —
a value is NaN/Inf iff all its exponent bits are set: ``max(bits & EXP) == EXP``.
Only storages that fail are counted again element by element, per tensor.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass, field, replace

from torchdoctor.checkpoint.fsutil import open_regular
from torchdoctor.checkpoint.values import FLOAT_DTYPES, Storage, TensorInfo

CHUNK = 32 << 20  # bytes per window
AHEAD = 256 << 20  # how far ahead of the check the kernel is asked to read (POSIX_FADV_WILLNEED)
MAX_GAP = 1 << 16  # storages closer than this are checked in one window
MAX_COUNTED = 256  # tensors on failing storages that are counted element by element

# dtype -> (numpy uint type code, exponent mask, mantissa mask, rule)
#   ieee: NaN/Inf iff exponent all ones; fn: NaN iff all bits but sign set (no Inf); fnuz: NaN iff == 0x80
_BITS = {
    "float16": ("u2", 0x7C00, 0x03FF, "ieee"),
    "bfloat16": ("u2", 0x7F80, 0x007F, "ieee"),
    "complex32": ("u2", 0x7C00, 0x03FF, "ieee"),
    "float8_e5m2": ("u1", 0x7C, 0x03, "ieee"),
    "float8_e4m3fn": ("u1", 0x7F, 0x00, "fn"),
    "float8_e4m3fnuz": ("u1", 0xFF, 0x00, "fnuz"),
    "float8_e5m2fnuz": ("u1", 0xFF, 0x00, "fnuz"),
}
_NATIVE = {"float32": "f4", "float64": "f8", "complex64": "f4", "complex128": "f8"}


@dataclass
class TensorHit:
    name: str
    dtype: str
    shape: tuple
    nan: int
    posinf: int
    neginf: int
    first_index: int  # flat index (in the tensor's storage range) of the first bad value


@dataclass
class ScanResult:
    tensors_scanned: int = 0
    storages_scanned: int = 0
    bytes_scanned: int = 0
    seconds: float = 0.0
    backend: str = ""
    hits: list[TensorHit] = field(default_factory=list)
    not_scanned: list[str] = field(default_factory=list)  # "name (reason)"
    skipped_reason: str | None = None  # the whole scan could not run


class NumpyOps:
    """The checks with numpy (preferred: ≈ 0.1 s to import)."""

    def __init__(self):
        import numpy as np

        self.np = np
        self.name = f"numpy {np.__version__}"

    def itemsize(self, dtype: str) -> int:
        return self.np.dtype(_NATIVE.get(dtype) or _BITS[dtype][0]).itemsize

    def view(self, buf, dtype: str, byteorder: str):
        bo = ">" if byteorder == "big" else "<"
        if dtype in _NATIVE:
            return self.np.frombuffer(buf, dtype=bo + _NATIVE[dtype])
        code = _BITS[dtype][0]
        return self.np.frombuffer(buf, dtype=(bo if code != "u1" else "|") + code)

    def bad(self, arr, dtype: str) -> bool:
        np = self.np
        if arr.size == 0:
            return False
        if dtype in _NATIVE:
            # Fast path (≈ 1.8× isfinite().all() on a 32 MiB window, CPU box): NaN/Inf propagate
            # through a dot product, so a finite x·x proves every element finite; an overflow of
            # x·x (|x| > 1e19 in float32) only sends the window to the exact check.
            if arr.ndim == 1:
                with np.errstate(all="ignore"):
                    if np.isfinite(np.dot(arr, arr)):
                        return False
            return not bool(np.isfinite(arr).all())
        _code, exp, _mant, rule = _BITS[dtype]
        if rule == "fnuz":
            return bool((arr == 0x80).any())
        return int(np.bitwise_and(arr, exp).max()) == exp

    def count(self, arr, dtype: str) -> tuple[int, int, int, int]:
        np = self.np
        if dtype in _NATIVE:
            nan, pinf, ninf = np.isnan(arr), np.isposinf(arr), np.isneginf(arr)
        else:
            _code, exp, mant, rule = _BITS[dtype]
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
        if dtype in _NATIVE:
            return t.contiguous().view(-1).numpy().view(_NATIVE[dtype])
        import torch

        width = {"u2": torch.int16, "u1": torch.uint8}[_BITS[dtype][0]]
        return t.contiguous().view(-1).view(width).numpy().view(self.np.dtype(_BITS[dtype][0]))


# torch fallback (numpy absent): every float type checked by its bits, as signed ints
_TORCH_BITS = {  # dtype -> (bytes per value, exponent mask, mantissa mask, rule)
    "float32": (4, 0x7F800000, 0x007FFFFF, "ieee"), "complex64": (4, 0x7F800000, 0x007FFFFF, "ieee"),
    "float64": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF, "ieee"),
    "complex128": (8, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF, "ieee"),
    **{k: ({"u2": 2, "u1": 1}[v[0]],) + v[1:] for k, v in _BITS.items()},
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


def scannable(t: TensorInfo) -> bool:
    return t.dtype in FLOAT_DTYPES and (t.dtype in _NATIVE or t.dtype in _BITS)


def scan_tensors(named: list[tuple[str, TensorInfo]]) -> ScanResult:
    """Check every floating tensor of ``named`` for NaN/Inf; see the module docstring."""
    res = ScanResult()
    ops = backend()
    if ops is None:
        res.skipped_reason = "neither numpy nor torch is installed"
        return res
    res.backend = ops.name
    t0 = time.perf_counter()
    by_storage: dict[str, tuple[Storage, list[tuple[str, TensorInfo]]]] = {}
    seen: set[int] = set()
    for name, t in named:
        if t.dtype not in FLOAT_DTYPES or id(t) in seen:  # one tensor reached by many paths is checked once
            continue
        seen.add(id(t))
        if not scannable(t):
            res.not_scanned.append(f"{name} ({t.dtype}: no check for this dtype)")
            continue
        parts = t.data()
        if not parts:
            if t.device != "meta":
                res.not_scanned.append(f"{name} (bytes not located)")
            continue
        size = ops.itemsize(t.dtype)
        if any(st.data is None and st.nbytes % size for st in parts):
            res.not_scanned.append(f"{name} (storage size is not a multiple of {size} bytes)")
            continue
        res.tensors_scanned += 1
        for st in parts:
            if st.dtype != t.dtype:  # e.g. float8 tensors over an UntypedStorage (uint8): check as the tensor
                st = replace(st, dtype=t.dtype, key=f"{st.key}#{t.dtype}")
            by_storage.setdefault(st.key, (st, []))[1].append((name, t))
    bad_storages = _scan_storages(ops, [v[0] for v in by_storage.values()], res)
    counted = 0
    for key in bad_storages:
        st, users = by_storage[key]
        for name, t in users:
            if counted >= MAX_COUNTED:  # each count re-reads the tensor's bytes: bounded work
                res.not_scanned.append(f"{name} (on a storage with NaN/Inf; only the first {MAX_COUNTED} "
                                       "such tensors are counted)")
                continue
            counted += 1
            hit = _count_tensor(ops, st, t, name)
            if hit is not None:
                res.hits.append(hit)
    res.seconds = time.perf_counter() - t0
    return res


def _scan_storages(ops, storages: list[Storage], res: ScanResult) -> list[str]:
    """Stream the storages in file order; return the keys of those holding NaN/Inf."""
    bad: list[str] = []
    in_memory = [s for s in storages if s.data is not None]
    for st in in_memory:
        arr = _memory_array(ops, st)
        res.storages_scanned += 1
        res.bytes_scanned += st.nbytes
        if arr is not None and ops.bad(arr, st.dtype):
            bad.append(st.key)
    on_disk = sorted((s for s in storages if s.data is None), key=lambda s: (s.path, s.offset))
    by_path: dict[str, list[Storage]] = {}
    for s in on_disk:
        by_path.setdefault(s.path, []).append(s)
    for path, group in by_path.items():
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            size = os.fstat(fd).st_size
            inside = []
            for s in group:  # checked before any window is planned: a claimed size costs nothing
                if s.offset < 0 or s.nbytes < 0 or s.offset + s.nbytes > size:
                    res.not_scanned.append(f"{s.key}: {s.nbytes} bytes at offset {s.offset} lie outside the file "
                                           f"({size} bytes)")
                else:
                    inside.append(s)
            _advise(fd, 0, 0, "SEQUENTIAL")
            if inside:
                _advise(fd, inside[0].offset, AHEAD, "WILLNEED")
            for win_off, win_len, pieces in _windows(inside):
                _advise(fd, win_off + AHEAD, CHUNK, "WILLNEED")  # keep the disk busy ahead of the check
                _check_window(ops, fd, win_off, win_len, pieces, bad, res)
                res.bytes_scanned += sum(p[2] for p in pieces)
        finally:
            os.close(fd)
    return bad


def _check_window(ops, fd: int, win_off: int, win_len: int, pieces: list, bad: list, res: ScanResult) -> None:
    """Map one window (page-aligned), check its pieces, unmap: resident memory stays ≤ one window."""
    base = win_off - win_off % mmap.ALLOCATIONGRANULARITY
    m = mmap.mmap(fd, win_off + win_len - base, prot=mmap.PROT_READ, offset=base)
    try:
        mv = memoryview(m)
        for st, p_off, p_len in pieces:
            if st.key not in bad:
                rel = st.offset + p_off - base
                arr = ops.view(mv[rel:rel + p_len], st.dtype, st.byteorder)
                if ops.bad(arr, st.dtype):
                    bad.append(st.key)
                del arr
            if p_off + p_len >= st.nbytes:
                res.storages_scanned += 1
        mv.release()
    finally:
        try:
            m.close()
        except BufferError:  # a view is still alive (only while an exception unwinds): unmapped on release
            pass


def _advise(fd: int, off: int, length: int, what: str) -> None:
    adv = getattr(os, f"POSIX_FADV_{what}", None)
    if adv is not None:
        try:
            os.posix_fadvise(fd, off, length, adv)
        except OSError:
            pass


def _windows(group: list[Storage]):
    """Yield (file offset, length, [(storage, offset in storage, length)]) read windows.

    Windows are at most CHUNK bytes, aligned to the element size inside each storage,
    and merge neighbouring storages separated by less than MAX_GAP bytes.
    """
    step = max(16, (CHUNK // 16) * 16)
    pieces = ((st, p, min(step, st.nbytes - p)) for st in group for p in range(0, st.nbytes, step))
    cur: list = []
    start = end = 0
    for st, p, n in pieces:
        a = st.offset + p
        if cur and (a - end > MAX_GAP or a + n - start > CHUNK or a < end):
            yield start, end - start, cur
            cur = []
        if not cur:
            start = a
        cur.append((st, p, n))
        end = a + n
    if cur:
        yield start, end - start, cur


def _memory_array(ops, st: Storage):
    """A view of an in-memory torch tensor (``--unsafe-load``)."""
    try:
        return ops.from_tensor(st.data, st.dtype)
    except Exception:  # noqa: BLE001 - unsupported layouts stay unscanned
        return None


def _count_tensor(ops, st: Storage, t: TensorInfo, name: str) -> TensorHit | None:
    """Count NaN/+Inf/-Inf in the element range of ``t`` inside storage ``st``."""
    if st.data is not None:
        arr = _memory_array(ops, st)
        if arr is None:
            return None
        nan, pinf, ninf, first = ops.count(arr, st.dtype)
    else:
        itemsize = ops.itemsize(st.dtype)
        per = 2 if st.dtype.startswith("complex") else 1
        lo = t.storage_offset * itemsize * per if t.parts == [] else 0
        extent = _extent(t) * itemsize * per if t.parts == [] else st.nbytes
        lo, hi = max(0, lo), min(st.nbytes, max(0, lo) + extent)
        nan = pinf = ninf = 0
        first = -1
        with open_regular(st.path) as f:
            pos = lo
            while pos < hi:
                n = min(CHUNK, hi - pos)
                f.seek(st.offset + pos)
                arr = ops.view(f.read(n), st.dtype, st.byteorder)
                a, b, c, fi = ops.count(arr, st.dtype)
                if fi >= 0 and first < 0:
                    first = (pos - lo) // itemsize + fi
                nan, pinf, ninf = nan + a, pinf + b, ninf + c
                pos += n
    if nan + pinf + ninf == 0:
        return None
    return TensorHit(name, t.dtype, tuple(t.shape), nan, pinf, ninf, first)


def _extent(t: TensorInfo) -> int:
    """Elements from the first to one past the last element the view reaches."""
    if not t.shape:
        return 1
    if not t.stride or len(t.stride) != len(t.shape):
        return t.numel
    if any(s == 0 for s in t.shape):
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride))
