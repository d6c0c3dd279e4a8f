"""What ``torch.load(weights_only=True)`` accepts, mirrored statically (no torch import).

Importing torch costs ≈ 1.5 s, more than the whole time budget of an audit, so the
verdict "would the weights-only unpickler refuse this file?" is computed from the globals
and opcodes the pickle contains, against this mirror of
``torch._weights_only_unpickler._get_allowed_globals()`` and of the opcodes its
``Unpickler.load`` implements (torch 2.6–2.13). ``tests/test_checkpoint_safety.py``
checks the mirror against the installed torch and against real ``torch.load`` outcomes.
"""

from __future__ import annotations

import re

# torch/_weights_only_unpickler.py: _get_allowed_globals (explicit names)
_EXPLICIT = frozenset({
    "collections.OrderedDict",
    "collections.Counter",
    "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout",
    "torch.Size",
    "torch.Tensor",
    "torch.device",
    "_codecs.encode",
    "builtins.bytearray",
    "builtins.set",
    "builtins.complex",
    "torch._tensor._rebuild_from_type_v2",
    "torch.per_tensor_affine",
    "torch.per_tensor_symmetric",
    "torch.per_channel_affine",
    "torch.per_channel_symmetric",
    "torch.per_channel_affine_float_qparams",
})

# torch._weights_only_unpickler._tensor_rebuild_functions
_REBUILD = frozenset(f"torch._utils.{n}" for n in (
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_tensor",
    "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor",
))

# dtypes: str(torch.float32) == "torch.float32" (storage map, _new_dtypes, uint1-7, int1-7)
DTYPE_NAMES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)),
})

# torch._tensor_classes (torch.FloatTensor, torch.cuda.HalfTensor, …) and
# torch._storage_classes (torch.FloatStorage, torch.cuda.FloatStorage, torch.UntypedStorage, …)
_TENSOR_CLASS = re.compile(r"^torch(\.cuda)?(\.sparse)?\.[A-Za-z0-9]*Tensor$")
_STORAGE_CLASS = re.compile(r"^torch(\.cuda)?\.[A-Za-z0-9]*Storage$|^torch\.storage\.(Untyped|Typed)Storage$")

# Names that, once allowlisted by the user, load a numpy RNG state
# (np.random.get_state()) with weights_only=True.
NUMPY_RNG_GLOBALS = (
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
)
_NUMPY_SAFE = frozenset({
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct",
    "numpy.ndarray", "numpy.dtype",
}) | frozenset(f"numpy.dtypes.{t}DType" for t in (
    "UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32", "Int64",
    "Float16", "Float32", "Float64", "Bool"))

# DTensor state (a per-rank torch.save of FSDP2 / tensor-parallel state dicts): torch allowlists
# these when torch.distributed.tensor is imported (torch/distributed/tensor/__init__.py and
# device_mesh.py call add_safe_globals; torch 2.13), which every FSDP2/TP script does; a bare
# torch.load in a fresh process refuses them ("torch.distributed.tensor must be imported to load
# DTensors").
DTENSOR_GLOBALS = frozenset({
    "torch.distributed.tensor.DTensor", "torch.distributed.tensor._api.DTensor",
    "torch.distributed.device_mesh.DeviceMesh",
    "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta",
    "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.tensor.placement_types.Partial",
    "torch.distributed.tensor.placement_types.Replicate",
    "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types._StridedShard",
    "torch.distributed._mesh_layout._MeshLayout", "torch.distributed._mesh_layout._FlatLayout",
})

# Opcodes torch._weights_only_unpickler.Unpickler.load implements (pickle protocol 2).
WEIGHTS_ONLY_OPS = frozenset({
    "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE",
    "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT",
    "BINUNICODE", "SHORT_BINSTRING", "BINPERSID", "BINGET", "LONG_BINGET", "BINPUT",
    "LONG_BINPUT", "LONG1", "PROTO", "STOP",
})

# modules the weights-only unpickler refuses even when a user allowlists them
BLOCKED_MODULES = frozenset({"sys", "os", "posix", "nt"})


def is_weights_only_global(name: str) -> bool:
    """True if ``torch.load(weights_only=True)`` accepts the global ``module.qualname``."""
    if name in _EXPLICIT or name in _REBUILD:
        return True
    if name.startswith("torch.") and name[6:] in DTYPE_NAMES:
        return True
    return bool(_TENSOR_CLASS.match(name) or _STORAGE_CLASS.match(name))


def is_numpy_array_global(name: str) -> bool:
    """numpy array/dtype reconstruction: harmless, but refused unless allowlisted."""
    return name in _NUMPY_SAFE


def is_dtensor_global(name: str) -> bool:
    """A DTensor class torch allowlists once ``torch.distributed.tensor`` is imported."""
    return name in DTENSOR_GLOBALS
