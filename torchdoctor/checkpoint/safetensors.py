"""Reader of the safetensors format, without the ``safetensors`` package.

Layout: an 8-byte little-endian header length N, N bytes of JSON
``{"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [...],
"data_offsets": [begin, end]}, ...}``, then the data; offsets count from the byte after
the header. No pickle, so nothing in it can execute.
"""

from __future__ import annotations

import json
import os
import struct
from collections import OrderedDict

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import open_regular
from torchdoctor.checkpoint.values import ITEMSIZE, Storage, TensorInfo, brief, plain

MAX_HEADER = 100 * 1024 * 1024  # the reference implementation refuses larger headers too
READ_HEADER = 16 << 20  # headers this torchdoctor parses (bounded memory; real ones are < 1 MiB)
MAX_NUMEL = 1 << 62

DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64", "C128": "complex128",
}


def looks_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= MAX_HEADER and head[8:9] == b"{"  # size checked by read_header (truncation)


def read_header(path: str) -> tuple[dict, int, int]:
    """(header dict, data start offset, file size); raises :class:`Unreadable`."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise Unreadable("truncated safetensors", f"{size} bytes: no header length", path)
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise Unreadable("truncated safetensors",
                             f"header says {n} bytes of JSON but the file has {size - 8} after the length", path)
        if n > READ_HEADER:
            raise Unreadable("oversized safetensors header",
                             f"{n} bytes of JSON header (limit {READ_HEADER >> 20} MiB)", path)
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Unreadable("corrupt safetensors", f"header is not valid JSON: {type(e).__name__}: "
                         f"{brief(str(e), 160)}", path) from None
    if not isinstance(header, dict):
        raise Unreadable("corrupt safetensors", "header is not a JSON object", path)
    return header, 8 + n, size


def read_safetensors(path: str) -> tuple[OrderedDict, dict]:
    """The tensors (name → :class:`TensorInfo`, in file order) and the ``__metadata__``."""
    header, start, size = read_header(path)
    meta = header.pop("__metadata__", None) or {}
    out: OrderedDict[str, TensorInfo] = OrderedDict()
    entries = []
    for name, spec in header.items():
        if not isinstance(spec, dict) or "dtype" not in spec or "data_offsets" not in spec:
            raise Unreadable("corrupt safetensors", f"entry {brief(name, 80)} lacks dtype/data_offsets", path)
        offs, shape = spec["data_offsets"], spec.get("shape", [])
        if not (isinstance(offs, list) and len(offs) == 2 and all(_count(x) for x in offs)
                and isinstance(shape, list) and all(_count(x) for x in shape) and _numel(shape) <= MAX_NUMEL
                and isinstance(spec["dtype"], str) and len(spec["dtype"]) <= 32):
            raise Unreadable("corrupt safetensors", f"entry {brief(name, 80)}: bad dtype, shape or data_offsets "
                             "(non-negative integers expected)", path)
        entries.append((offs[0], offs[1], name, spec["dtype"], tuple(shape)))
    for begin, end, name, st_dtype, shape in sorted(entries, key=lambda e: (e[0], e[1])):
        dtype = DTYPES.get(st_dtype, st_dtype.lower())
        if end < begin or start + end > size:
            raise Unreadable("truncated safetensors" if end >= begin else "corrupt safetensors",
                             f"tensor {brief(name, 80)} needs bytes {begin}..{end} after the header but the file "
                             f"has {size - start}", path)
        t = TensorInfo(dtype=dtype, shape=shape, storage=Storage(path, start + begin, end - begin,
                                                                   key=f"{path}:{name}", dtype=dtype))
        if dtype in ITEMSIZE and t.nbytes != end - begin:
            raise Unreadable("corrupt safetensors",
                             f"tensor {brief(name, 80)}: {list(shape)} {dtype} needs {t.nbytes} bytes, offsets give "
                             f"{end - begin}", path)
        out[name] = t
    return out, {str(k): plain(v) if isinstance(v, str) else brief(v) for k, v in meta.items()} \
        if isinstance(meta, dict) else {}


def _count(x) -> bool:
    """A JSON non-negative integer (not a bool, not a float such as 1e999)."""
    return type(x) is int and 0 <= x < 1 << 63


def _numel(shape: list) -> int:
    n = 1
    for s in shape:
        n *= s
        if n > MAX_NUMEL:
            return n
    return n
