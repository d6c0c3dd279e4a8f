"""The value model a checkpoint is read into: containers, tensor descriptions, opaque objects.

Readers never build real torch tensors or import the classes a pickle names. A tensor
becomes a :class:`TensorInfo` (dtype, shape, device, where its bytes lie in which file);
an object of any class that is not a plain container becomes an :class:`Opaque` that
records the class name and the arguments/state the pickle gave it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# bytes per element of each dtype name (torch names, without "torch.")
ITEMSIZE: dict[str, float] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
}

FLOAT_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
})


@dataclass(frozen=True)
class Storage:
    """Where a storage's bytes lie: ``nbytes`` bytes at absolute ``offset`` of ``path``.

    ``key`` identifies the storage inside its container (zip record name, legacy key,
    safetensors tensor name) so that tensors sharing one storage can be recognised.
    ``data`` holds an in-memory tensor instead (only after ``--unsafe-load``).
    """

    path: str
    offset: int
    nbytes: int
    key: str
    dtype: str
    byteorder: str = "little"
    data: Any = None


@dataclass
class TensorInfo:
    """One tensor as saved: no data is read until the NaN/Inf scan asks for it.

    ``shape`` in elements, ``storage_offset`` in elements of ``dtype``; ``storage`` is
    None for tensors that carry no data (meta device, or a format that only lists them).
    """

    dtype: str
    shape: tuple[int, ...]
    device: str = "cpu"
    storage: Storage | None = None
    storage_offset: int = 0
    stride: tuple[int, ...] | None = None
    kind: str = "tensor"  # tensor | parameter | <subclass qualname>
    requires_grad: bool = False
    state: Any = None  # __setstate__ payload (tensor attributes), rarely used
    ref: Any = None  # the reader's storage reference, resolved after the pickle (legacy format)
    parts: list = field(default_factory=list)  # DCP: one Storage per saved chunk

    def data(self) -> list[Storage]:
        """The storages holding this tensor's bytes (empty when none was saved)."""
        st = self.storage if self.storage is not None else getattr(self.ref, "resolved", None)
        return [st] if st is not None else list(self.parts)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= max(0, int(s)) if isinstance(s, int) else 0
        return n

    @property
    def nbytes(self) -> int:
        return int(self.numel * ITEMSIZE.get(self.dtype, 1))

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def __setstate__(self, state: Any) -> None:  # BUILD on a rebuilt tensor
        self.state = state


MAX_CALL_NAME = 200


class Opaque:
    """An object whose class the pickle names but which was never imported or run.

    ``cls`` is "module.qualname"; ``args``/``kwargs`` what the pickle passed to it,
    ``state`` what BUILD gave it, ``items``/``list_items`` what SETITEM(S)/APPEND(S) added.
    """

    cls = "?"

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = object.__new__(cls)
        obj.args = args
        obj.kwargs = kwargs
        obj.state = None
        obj.items = {}
        obj.list_items = []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> "Opaque":
        """Calling a stand-in (``getattr(...)(...)`` chains) only records the call.

        The name grows by ``()`` per call up to a bound: a pickle of 20 000 chained calls
        must not build 20 000 ever-longer class names (quadratic memory).
        """
        name = f"{self.cls}()" if len(self.cls) < MAX_CALL_NAME else self.cls
        return opaque_type(name)(*args, **kwargs)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.list_items.append(value)

    def extend(self, values: Any) -> None:
        self.list_items.extend(values)

    def __repr__(self) -> str:
        return f"<{self.cls}>"

    @property
    def attrs(self) -> dict:
        """The attributes the object would have: its BUILD state (dict part)."""
        st = self.state
        if isinstance(st, tuple) and len(st) == 2 and (st[0] is None or isinstance(st[0], dict)):
            merged = dict(st[0] or {})
            if isinstance(st[1], dict):
                merged.update(st[1])
            return merged
        return st if isinstance(st, dict) else {}


class Unread:
    """A value the checkpoint holds but whose data could not be read (a DCP byte item in a
    missing rank's data file): present, value unknown. Rules that look for a key (a progress
    counter) count it as present; the unreadable part is ckpt-unreadable's finding."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"<unread: {self.why}>"


_OPAQUE_TYPES: dict[str, type] = {}


def opaque_type(qualname: str) -> type:
    """A subclass of :class:`Opaque` standing for the global ``qualname`` (cached)."""
    t = _OPAQUE_TYPES.get(qualname)
    if t is None:
        short = qualname.rsplit(".", 1)[-1] or "Opaque"
        safe = "".join(c if c.isalnum() or c == "_" else "_" for c in short) or "Opaque"
        t = type(safe, (Opaque,), {"cls": qualname})
        _OPAQUE_TYPES[qualname] = t
    return t


@dataclass
class NdArrayInfo:
    """A pickled numpy array (e.g. inside ``np.random.get_state()``): shape, dtype, bytes."""

    shape: tuple[int, ...] = ()
    dtype: str = "?"
    nbytes: int = 0
    args: tuple = ()

    def __setstate__(self, state: Any) -> None:
        # numpy's ndarray.__reduce__ state: (version, shape, dtype, is_fortran, rawdata)
        if isinstance(state, tuple) and len(state) >= 5:
            self.shape = tuple(int(x) for x in state[1]) if isinstance(state[1], tuple) else ()
            self.dtype = str(state[2])
            raw = state[4]
            self.nbytes = len(raw) if isinstance(raw, (bytes, bytearray, str)) else 0


@dataclass
class NpDType:
    """A pickled ``numpy.dtype``: its first argument is the type code ('u4', 'f8', ...)."""

    code: str = "?"
    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __str__(self) -> str:
        return self.code


@dataclass(eq=False)
class PickleInfo:
    """What the opcode scan of one pickle found (see ``pickle_scan``).

    ``error`` is set when the scan stopped early (truncated or corrupt stream): the globals
    seen before that point are kept, because ``pickle.load`` would already have imported
    and called them before reaching the broken opcode.
    """

    name: str  # which pickle: "data.pkl", a file name, "…/.metadata"
    globals: list[str] = field(default_factory=list)  # module.qualname, in first-seen order
    protocol: int | None = None
    unsupported_ops: list[str] = field(default_factory=list)  # opcodes weights_only rejects
    persistent_kinds: list[str] = field(default_factory=list)  # "storage", "module"
    strings: set[str] = field(default_factory=set)  # a few tell-tale string constants seen
    error: str | None = None  # why the scan stopped before STOP (None: complete)


@dataclass
class Contents:
    """Everything a reader extracted from a checkpoint path.

    ``root`` is the reconstructed top-level object; for multi-file checkpoints
    (directories, sharded indexes) it is a dict keyed by file or by role.
    """

    path: str
    format: str  # torch-zip | torch-legacy | safetensors | dcp | hf-index | directory
    root: Any = None
    files: list[dict] = field(default_factory=list)  # {"path", "bytes", "format"}
    pickles: list[PickleInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)  # format metadata (safetensors __metadata__, …)
    weights_only_roots: set = field(default_factory=set)  # root keys read from weights-only formats
    problems: list[dict] = field(default_factory=list)  # {"what", "reason"} for parts that failed
    unsafe_loaded: bool = False
    layout: dict | None = None  # a single file of a known multi-file layout (layout.sibling_layout)

    @property
    def total_bytes(self) -> int:
        return sum(int(f.get("bytes", 0)) for f in self.files)


# -- bounded views of untrusted values (repr/str of a crafted value can be huge or raise) ----------

MAX_INT_BITS = 256  # ints wider than this are shown by size: str() of a 5000-digit int raises


def plain(v: Any, limit: int = 200) -> Any:
    """A JSON-safe, bounded copy of a scalar read from a checkpoint (containers become a summary)."""
    if v is None or isinstance(v, (bool, float)):
        return v
    if isinstance(v, int):
        return v if v.bit_length() <= MAX_INT_BITS else f"<int of {v.bit_length()} bits>"
    if isinstance(v, str):
        return v if len(v) <= limit else v[:limit] + f"… (+{len(v) - limit} chars)"
    return brief(v, limit)


def brief(v: Any, limit: int = 120, depth: int = 0) -> str:
    """``repr`` that never recurses deeply, never converts huge ints, and stays near ``limit`` chars."""
    if depth > 3:
        return "…"
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, int):
        return repr(v) if v.bit_length() <= MAX_INT_BITS else f"<int of {v.bit_length()} bits>"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (str, bytes, bytearray)):
        r = repr(v[:limit])
        return r + (f"… (+{len(v) - limit})" if len(v) > limit else "")
    if isinstance(v, TensorInfo):
        return f"<tensor {brief(v.dtype, 40, depth + 1)}>"
    if isinstance(v, Opaque):
        return f"<{v.cls[:limit]}>"
    if isinstance(v, Unread):
        return f"<unread: {v.why[:limit]}>"
    if isinstance(v, (list, tuple, set, frozenset, dict)):
        items = list(v.items())[:6] if isinstance(v, dict) else list(v)[:6] if not isinstance(
            v, (set, frozenset)) else [x for _i, x in zip(range(6), v)]
        if isinstance(v, dict):
            parts = [f"{brief(k, 40, depth + 1)}: {brief(x, 60, depth + 1)}" for k, x in items]
        else:
            parts = [brief(x, 60, depth + 1) for x in items]
        more = ", …" if len(v) > 6 else ""
        o, c = ("{", "}") if isinstance(v, (dict, set, frozenset)) else ("(", ")") if isinstance(v, tuple) \
            else ("[", "]")
        s = o + ", ".join(parts) + more + c
        return s if len(s) <= 4 * limit else s[:4 * limit] + "…"
    return f"<{type(v).__name__}>"
