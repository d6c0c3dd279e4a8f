"""Rebuild a pickle's object tree without importing or calling anything it names.

The standard unpickler resolves every class and function through ``find_class``
(GLOBAL, STACK_GLOBAL, INST, EXT*), and every REDUCE/NEWOBJ/BUILD acts on what
``find_class`` returned. Here ``find_class`` never imports: it returns

* a few pure, bounded constructors of plain data (OrderedDict, set, bytes from latin-1,
  complex, torch.Size → tuple, torch dtypes → names),
* stand-ins for torch's tensor rebuild functions that return :class:`TensorInfo`
  descriptions (the bytes stay on disk),
* for every other name an :class:`Opaque` subclass that only records the arguments and
  state it is given.

So no code from the file runs, whatever the file says; the price is that objects of
unknown classes stay opaque (their recorded ``state`` is usually enough to audit them).
"""

from __future__ import annotations

import io
import pickle
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections import Counter, OrderedDict
from typing import Any, Callable

from torchdoctor.checkpoint.allowlist import DTYPE_NAMES
from torchdoctor.checkpoint.values import NdArrayInfo, NpDType, Opaque, Storage, TensorInfo, brief, opaque_type

# legacy storage class name -> dtype name
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128", "ComplexFloatStorage": "complex64",
    "QUInt8Storage": "quint8", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8", "TypedStorage": "uint8",
}
_MAX_BYTES_CTOR = 1 << 20  # bytes(n)/bytearray(n) with an int: refuse big allocations


class DType(str):
    """A torch dtype named by the pickle (``torch.float16`` → "float16")."""


class StorageType:
    """A torch storage class named by the pickle; only its element dtype matters."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = STORAGE_DTYPES.get(name, "uint8")


class StorageRef:
    """A persistent-id storage reference (the reader resolves it to a :class:`Storage`)."""

    def __init__(self, key: str, dtype: str, location: str, numel: int):
        self.key, self.dtype, self.location, self.numel = key, dtype, location, numel
        self.resolved: Storage | None = None


def _s(v: Any, limit: int = 100) -> str:
    """``str`` of a value from the pickle, bounded (a crafted int or object must not raise or bloat)."""
    if isinstance(v, str):
        return v if len(v) <= limit else v[:limit] + "…"
    return brief(v, limit) if not isinstance(v, DType) else str(v)


def _device(loc: Any) -> str:
    s = loc.decode("ascii", "replace") if isinstance(loc, bytes) else _s(loc)
    return s or "cpu"


_I64 = 1 << 63


def _dim(v: Any) -> int:
    """A shape/stride/offset entry: an int64 as torch has it (a crafted value outside is -1, i.e. invalid)."""
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and -_I64 <= v < _I64 else -1


def _as_tuple(x: Any) -> tuple:
    if isinstance(x, (tuple, list)) and len(x) <= 64:
        return tuple(_dim(v) for v in x)
    return ()


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False,
            dtype: str | None = None) -> TensorInfo | Opaque:
    if not isinstance(storage, StorageRef):
        return opaque_type("torch._utils._rebuild_tensor")(storage, offset, size, stride)
    return TensorInfo(
        dtype=_s(dtype) if dtype else storage.dtype,
        shape=_as_tuple(size),
        device=_device(storage.location),
        storage=storage.resolved,
        ref=storage,
        storage_offset=max(0, _dim(offset)),
        stride=_as_tuple(stride),
        requires_grad=bool(requires_grad) if isinstance(requires_grad, bool) else False,
    )


def _rebuild_tensor(storage, offset, size, stride, *_rest):
    return _tensor(storage, offset, size, stride)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, *_rest):
    return _tensor(storage, offset, size, stride, requires_grad)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad=False, _hooks=None, dtype=None, *_rest):
    return _tensor(storage, offset, size, stride, requires_grad, dtype if isinstance(dtype, DType) else None)


def _rebuild_qtensor(storage, offset, size, stride, _qparams=None, requires_grad=False, *_rest):
    return _tensor(storage, offset, size, stride, requires_grad)


def _rebuild_parameter(data, requires_grad=True, *_rest):
    if isinstance(data, TensorInfo):
        data.kind = "parameter"
        data.requires_grad = bool(requires_grad) if isinstance(requires_grad, bool) else True
        return data
    return opaque_type("torch._utils._rebuild_parameter")(data, requires_grad)


def _rebuild_parameter_with_state(data, requires_grad=True, _hooks=None, state=None, *_rest):
    out = _rebuild_parameter(data, requires_grad)
    if isinstance(out, TensorInfo):
        out.state = state
    return out


def _rebuild_from_type_v2(func, new_type, args, state):
    if not callable(func) or not isinstance(args, tuple):
        return opaque_type("torch._tensor._rebuild_from_type_v2")(func, new_type, args, state)
    ret = func(*args)  # func is one of ours or an Opaque class: never user code
    local = None if isinstance(ret, TensorInfo) else _wrapped_local(state)
    if local is not None:
        # a wrapper subclass that keeps its data in a plain tensor (a DTensor: this rank's shard,
        # in ``_local_tensor``; ``_rebuild_wrapper_subclass`` made only an empty shell)
        if isinstance(new_type, type) and issubclass(new_type, Opaque):
            local.kind = new_type.cls
        return local
    if isinstance(ret, TensorInfo) and isinstance(new_type, type) and issubclass(new_type, Opaque):
        if new_type.cls != "torch.Tensor":
            ret.kind = new_type.cls
        if state:
            ret.state = state
    return ret


def _wrapped_local(state: Any) -> TensorInfo | None:
    """The ``_local_tensor`` of a pickled wrapper subclass's state (a dict, or the dict part of a
    (dict, slots) pair), when it is a tensor."""
    for part in (state if isinstance(state, tuple) else (state,)):
        if isinstance(part, dict) and isinstance(part.get("_local_tensor"), TensorInfo):
            return part["_local_tensor"]
    return None


def _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad=False, *_rest):
    return TensorInfo(dtype=_s(dtype), shape=_as_tuple(size), device="meta", stride=_as_tuple(stride))


def _rebuild_device_tensor(data, dtype=None, device=None, requires_grad=False, *_rest):
    if isinstance(data, TensorInfo):
        data.device = _device(device) if device is not None else data.device
        return data
    if isinstance(data, NdArrayInfo):
        return TensorInfo(dtype=_s(dtype or data.dtype), shape=_as_tuple(data.shape), device=_device(device))
    return opaque_type("torch._utils._rebuild_device_tensor_from_cpu_tensor")(data, dtype, device)


def _parameter(data=None, requires_grad=True, *_rest):
    return _rebuild_parameter(data, requires_grad)


def _size(*args):
    return tuple(args[0]) if args and isinstance(args[0], (tuple, list)) else tuple(args)


def _torch_device(*args):
    if len(args) >= 2 and isinstance(args[1], int):
        return f"{args[0]}:{args[1]}"
    return _s(args[0]) if args else "cpu"


def _codecs_encode(obj=None, encoding="utf-8", *_rest):
    if isinstance(obj, str) and _s(encoding).lower().replace("_", "-") in ("latin1", "latin-1", "iso-8859-1"):
        return obj.encode("latin-1")
    return opaque_type("_codecs.encode")(obj, encoding)


def _bytes_like(kind: type) -> Callable:
    def ctor(*args):
        if args and isinstance(args[0], int) and args[0] > _MAX_BYTES_CTOR:
            raise pickle.UnpicklingError(f"refusing {kind.__name__}({args[0]})")
        if args and isinstance(args[0], str):
            return kind(args[0], *args[1:2]) if len(args) > 1 and isinstance(args[1], str) else kind(args[0], "latin-1")
        return kind(*args[:1])
    return ctor


def _np_reconstruct(*args):
    return NdArrayInfo(args=args)


def _np_dtype(*args):
    return NpDType(code=_s(args[0]) if args else "?")


def _layout(name=None, *_rest):
    return f"layout:{name}"


_FIXED: dict[str, Any] = {
    "collections.OrderedDict": OrderedDict,
    "collections.Counter": Counter,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.complex": complex,
    "builtins.bytearray": _bytes_like(bytearray),
    "builtins.bytes": _bytes_like(bytes),
    "_codecs.encode": _codecs_encode,
    "torch.Size": _size,
    "torch.device": _torch_device,
    "torch.serialization._get_layout": _layout,
    "torch.nn.parameter.Parameter": _parameter,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_qtensor": _rebuild_qtensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter_with_state,
    "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta_tensor_no_storage,
    "torch._utils._rebuild_device_tensor_from_cpu_tensor": _rebuild_device_tensor,
    "torch._utils._rebuild_device_tensor_from_numpy": _rebuild_device_tensor,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
    "numpy._core.multiarray._reconstruct": _np_reconstruct,
    "numpy.core.multiarray._reconstruct": _np_reconstruct,
    "numpy.dtype": _np_dtype,
}


def _copyreg_reconstructor(cls=None, base=None, state=None, *_rest):
    # protocol 0/1 objects: copyreg._reconstructor(cls, object, None) -> cls.__new__(cls)
    if isinstance(cls, type) and issubclass(cls, Opaque):
        return cls.__new__(cls)
    return opaque_type("copyreg._reconstructor")(cls, base, state)


def _copyreg_newobj(cls=None, *args):
    if isinstance(cls, type) and issubclass(cls, Opaque):
        return cls.__new__(cls, *args)
    return opaque_type("copyreg.__newobj__")(cls, *args)


_FIXED["copyreg._reconstructor"] = _copyreg_reconstructor
_FIXED["copyreg.__newobj__"] = _copyreg_newobj


def resolve_global(module: str, name: str) -> Any:
    """What ``find_class(module, name)`` yields: a safe stand-in, never the real object."""
    full = f"{module}.{name}"
    if full in _FIXED:
        return _FIXED[full]
    if module == "torch":
        if name in DTYPE_NAMES:
            return DType(name)
        if name.endswith("Storage"):
            return StorageType(name)
    if module in ("torch.storage", "torch.cuda") and name.endswith("Storage"):
        return StorageType(name)
    return opaque_type(full)


class StubUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` whose ``find_class`` never imports (see module docstring).

    ``on_storage(pid_tuple) -> StorageRef`` resolves torch persistent ids; other
    persistent ids (legacy ``module`` records) become opaque values.
    """

    def __init__(self, file, on_storage: Callable[[tuple], Any] | None = None):
        super().__init__(file, fix_imports=True, encoding="latin-1")
        self._on_storage = on_storage
        self.found: dict[str, None] = {}

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle API
        if (module, name) in NAME_MAPPING:  # Python 2 names, as pickle itself maps them
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
        self.found[f"{module}.{name}"] = None
        return resolve_global(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid:
            kind = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
            if kind == "storage" and self._on_storage is not None and len(pid) >= 5:
                return self._on_storage(pid)
            if kind == "module" and len(pid) >= 2 and isinstance(pid[1], type):
                return pid[1]  # legacy format: an nn.Module class saved with its source
        return opaque_type("<persistent id>")(brief(pid, 200))


def storage_ref(pid: tuple) -> StorageRef:
    """Turn ``('storage', storage_type, key, location, numel[, view])`` into a StorageRef."""
    stype = pid[1]
    dtype = stype.dtype if isinstance(stype, StorageType) else "uint8"
    key = pid[2].decode("ascii", "replace") if isinstance(pid[2], bytes) else _s(pid[2], 200)
    numel = max(0, _dim(pid[4]))
    return StorageRef(key, dtype, _device(pid[3]), numel)


def stub_load(data: bytes | io.BufferedIOBase, on_storage: Callable[[tuple], Any] | None = None) -> Any:
    """Unpickle ``data`` (bytes or a positioned file) with :class:`StubUnpickler`."""
    f = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    return StubUnpickler(f, on_storage).load()
