"""A description of what the script passes to ``torch.save``, in the checkpoint reader's value model.

The save audit judges a live save with the checkpoint family's own role recogniser
(``checkpoint/roles.py``), which reads the value model of ``checkpoint/values.py``: plain
containers, :class:`TensorInfo` for a tensor, :class:`Opaque` for any other object. This module
builds that tree from the live object in one bounded walk:

* a tensor (or Parameter) becomes a ``TensorInfo`` of its dtype, shape and device: its data is
  never read, copied or moved (no device sync); its storage address is noted aside
  (``Mirror.ptr``) so that a saved state_dict can be matched to a live model by identity;
* a dict, list or tuple becomes a new container of the mirrored children (the user's containers
  are only read); a set becomes a list;
* an ``nn.Module`` becomes an ``Opaque`` whose state holds its ``_parameters``, ``_buffers``,
  ``_modules`` and non-persistent buffer names, read from ``vars()`` (no attribute hooks run);
  the live module behind it is noted (``Mirror.module_of``);
* a numpy array becomes an ``NdArrayInfo`` (shape, dtype, bytes), so ``np.random.get_state()``
  is recognised as the reader recognises it in a file;
* any other object becomes an ``Opaque`` of its class name whose state is its ``vars()`` (read,
  never ``__getstate__``: no user code runs); scalars and strings are kept as they are.

Bounds: ``MAX_NODES`` objects, ``MAX_DEPTH`` levels (modules nest deeper: ``MAX_MODULE_DEPTH``);
past them the walk stops and says so (``Mirror.truncated``). A shared object is mirrored once
(the same mirror node is reused, as a pickle memo does), so cycles end. The memo is kept
(``Mirror.node_of``: live object -> its node) so that a saved container can be told to be a live
one, e.g. an optimizer's per-parameter state dicts, which its ``state_dict()`` hands out as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchdoctor.checkpoint.values import NdArrayInfo, TensorInfo, opaque_type

MAX_NODES = 200_000
MAX_DEPTH = 12
MAX_MODULE_DEPTH = 64
MAX_KEY_CHARS = 200


@dataclass
class Mirror:
    root: Any = None
    nodes: int = 0
    truncated: str | None = None
    ptr: dict[int, int] = field(default_factory=dict)  # id(TensorInfo) -> storage address + offset
    module_of: dict[int, int] = field(default_factory=dict)  # id(Opaque) -> id(live nn.Module)
    devices: set[str] = field(default_factory=set)
    node_of: dict[int, Any] = field(default_factory=dict)  # id(live object) -> its mirror node (the memo)


def mirror(obj: Any) -> Mirror:
    """The value-model tree of ``obj`` (see the module docstring)."""
    import torch

    m = Mirror()
    memo: dict[int, Any] = m.node_of
    module_t = torch.nn.Module
    tensor_t = torch.Tensor
    np = _numpy()

    dtypes: dict[Any, str] = {}

    def tensor(t: Any) -> TensorInfo:
        kind = "parameter" if isinstance(t, torch.nn.Parameter) else \
            "tensor" if type(t) is torch.Tensor else type(t).__qualname__
        dt = t.dtype
        name = dtypes.get(dt)
        if name is None:
            name = dtypes[dt] = str(dt).removeprefix("torch.")
        try:
            shape = tuple(t.shape)
            if t.is_nested:  # a jagged size is symbolic: -1
                shape = tuple(x if type(x) is int else -1 for x in shape)
        except Exception:  # noqa: BLE001 - a tensor subclass without plain sizes
            shape = ()
        info = TensorInfo(dtype=name, shape=shape, device=str(t.device), kind=kind, requires_grad=t.requires_grad)
        m.devices.add(info.device)
        try:
            ptr = data_ptr(t)
            if ptr is not None:
                m.ptr[id(info)] = ptr
        except Exception:  # noqa: BLE001 - a tensor subclass without storage: matched by keys
            pass
        return info

    def key(k: Any) -> Any:
        tk = type(k)
        if tk is str:
            return k if len(k) <= MAX_KEY_CHARS else k[:MAX_KEY_CHARS]
        if tk is int:
            return k
        if isinstance(k, (str, int)) and not isinstance(k, bool):
            return k if not isinstance(k, str) or len(k) <= MAX_KEY_CHARS else k[:MAX_KEY_CHARS]
        if isinstance(k, tensor_t):
            return "<tensor>"
        return f"<{type(k).__name__}>"

    def walk(o: Any, depth: int) -> Any:
        if o is None or isinstance(o, (bool, int, float, str, bytes, complex)):
            return o
        oid = id(o)
        if oid in memo:
            return memo[oid]
        if m.truncated:
            return None
        m.nodes += 1
        if m.nodes > MAX_NODES:
            m.truncated = f"more than {MAX_NODES} objects: described up to there"
            return None
        if isinstance(o, tensor_t):
            out = memo[oid] = tensor(o)
            return out
        if isinstance(o, module_t):
            return module(o, depth)
        if depth >= MAX_DEPTH:
            m.truncated = m.truncated or f"nested deeper than {MAX_DEPTH} levels: described up to there"
            return None
        if isinstance(o, dict):
            out = memo[oid] = {}
            for k, v in list(o.items()):
                out[key(k)] = walk(v, depth + 1)
            return out
        if isinstance(o, (list, set, frozenset)):
            out = memo[oid] = []
            out.extend(walk(v, depth + 1) for v in list(o))
            return out
        if isinstance(o, tuple):
            out = memo[oid] = tuple(walk(v, depth + 1) for v in o)
            return out
        if np is not None and isinstance(o, np.ndarray):
            out = memo[oid] = NdArrayInfo(shape=tuple(int(s) for s in o.shape), dtype=str(o.dtype),
                                          nbytes=int(o.nbytes))
            return out
        return opaque(o, depth)

    def module(mod: Any, depth: int) -> Any:
        out = memo[id(mod)] = _opaque_of(mod)()
        m.module_of[id(out)] = id(mod)
        if depth >= MAX_MODULE_DEPTH:
            return out
        d = vars(mod)
        state = {"training": bool(d.get("training", True))}
        for name in ("_parameters", "_buffers"):
            state[name] = {key(k): (tensor(v) if isinstance(v, tensor_t) else None)
                           for k, v in list((d.get(name) or {}).items())}
            m.nodes += len(state[name])
        state["_non_persistent_buffers_set"] = [key(k) for k in (d.get("_non_persistent_buffers_set") or ())]
        state["_modules"] = {key(k): (walk(v, depth + 1) if v is not None else None)
                             for k, v in list((d.get("_modules") or {}).items())}
        out.state = state
        return out

    def opaque(o: Any, depth: int) -> Any:
        out = memo[id(o)] = _opaque_of(o)()
        try:
            d = vars(o)
        except TypeError:  # no __dict__ (slots, builtins): the class name is what there is
            return out
        out.state = {key(k): walk(v, depth + 1) for k, v in list(d.items())}
        return out

    m.root = walk(obj, 0)
    return m


def _opaque_of(o: Any) -> type:
    cls = type(o)
    return opaque_type(f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls.__name__)}")


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")


def data_ptr(t: Any) -> int | None:
    """The address that identifies ``t``'s data (a DTensor: its local shard's), or None (no storage)."""
    import torch

    from torchdoctor.torch_internals import local_tensor

    t = local_tensor(t)  # a DTensor's data_ptr() is 0: its shard holds the storage
    try:
        if t.device.type == "meta" or t.layout != torch.strided:
            return None
        p = int(t.data_ptr())
    except Exception:  # noqa: BLE001 - a tensor subclass without storage: matched by keys
        return None
    return p or None
