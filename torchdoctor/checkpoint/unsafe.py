"""``--unsafe-load``: the one path that really unpickles (``weights_only=False``).

Only on explicit request, announced on stderr before anything is read. The loaded
objects are converted into the same value model as the safe readers produce (real
tensors become :class:`TensorInfo` whose storage holds the in-memory tensor), so roles,
scan and rules work unchanged. Formats without pickles (safetensors) and DCP folders
gain nothing from it and are left as read.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.errors import Unreadable, strip_ansi
from torchdoctor.checkpoint.values import Contents, NdArrayInfo, Storage, TensorInfo, opaque_type


def unsafe_load(contents: Contents) -> Any:
    if contents.format not in ("torch-zip", "torch-legacy", "pickle"):
        contents.notes.append(f"--unsafe-load: nothing to unpickle in a {contents.format} checkpoint")
        return contents.root
    import torch

    try:
        if contents.format == "pickle":
            import pickle

            with open(contents.path, "rb") as f:
                obj = pickle.load(f)  # noqa: S301 - explicit --unsafe-load
        else:
            obj = torch.load(contents.path, map_location="cpu", weights_only=False,
                             mmap=contents.format == "torch-zip")
    except Exception as e:  # noqa: BLE001 - the file's own failure is evidence
        raise Unreadable("unsafe load failed", strip_ansi(f"{type(e).__name__}: {e}").splitlines()[0],
                         contents.path) from None
    return convert(obj, torch)


def convert(obj: Any, torch: Any, depth: int = 0, memo: dict | None = None) -> Any:
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if depth > 48:
        return opaque_type(f"{type(obj).__module__}.{type(obj).__qualname__}")()
    if isinstance(obj, torch.Tensor):
        out = _tensor(obj, torch)
    elif isinstance(obj, torch.nn.Module):
        out = opaque_type(f"{type(obj).__module__}.{type(obj).__qualname__}")()
        out.state = {
            "_parameters": {k: _tensor(v, torch) for k, v in obj._parameters.items() if v is not None},
            "_buffers": {k: _tensor(v, torch) for k, v in obj._buffers.items() if v is not None},
            "_non_persistent_buffers_set": set(getattr(obj, "_non_persistent_buffers_set", set())),
            "_modules": {k: convert(v, torch, depth + 1, memo) for k, v in obj._modules.items() if v is not None},
        }
    elif isinstance(obj, dict):
        out = type(obj)() if type(obj) in (dict,) else {}
        memo[id(obj)] = out
        for k, v in obj.items():
            out[k if isinstance(k, (str, int, float, bool, tuple)) else str(k)] = convert(v, torch, depth + 1, memo)
    elif isinstance(obj, (list, tuple)):
        out = type(obj)(convert(v, torch, depth + 1, memo) for v in obj) if type(obj) in (list, tuple) else \
            [convert(v, torch, depth + 1, memo) for v in obj]
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes, complex)):
        out = obj
    elif type(obj).__module__ == "numpy" and hasattr(obj, "shape") and hasattr(obj, "dtype"):
        out = NdArrayInfo(shape=tuple(obj.shape), dtype=str(obj.dtype), nbytes=int(getattr(obj, "nbytes", 0)))
    else:
        out = opaque_type(f"{type(obj).__module__}.{type(obj).__qualname__}")()
        memo[id(obj)] = out
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            out.state = {k: convert(v, torch, depth + 1, memo) for k, v in state.items()}
    memo[id(obj)] = out
    return out


def _tensor(t: Any, torch: Any) -> TensorInfo:
    dtype = str(t.dtype).replace("torch.", "")
    kind = "parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
    st = Storage(path="<memory>", offset=0, nbytes=t.numel() * t.element_size(), key=f"mem:{id(t)}",
                 dtype=dtype, data=t.detach())
    return TensorInfo(dtype=dtype, shape=tuple(t.shape), device="cpu", storage=st, kind=kind,
                      requires_grad=bool(t.requires_grad))
