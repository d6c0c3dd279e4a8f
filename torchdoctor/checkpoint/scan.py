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
from torchdoctor.checkpoint.scan_ops import BITS, NATIVE, backend
from torchdoctor.checkpoint.values import FLOAT_DTYPES, Storage, TensorInfo

CHUNK = 32 << 20  # bytes per window
AHEAD = 256 << 20  # how far ahead of the check the kernel is asked to read (POSIX_FADV_WILLNEED)
MAX_GAP = 1 << 16  # storages closer than this are checked in one window
MAX_COUNTED = 256  # tensors on failing storages that are counted element by element

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


def scannable(t: TensorInfo) -> bool:
    return t.dtype in FLOAT_DTYPES and (t.dtype in NATIVE or t.dtype in BITS)


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
