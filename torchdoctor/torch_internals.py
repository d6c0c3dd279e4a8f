"""Every private torch API torchdoctor touches, in one place: a torch upgrade touches this file.

Lazy (importing this module imports no torch) and feature-detected: each accessor returns
``None`` (or a neutral value) where the running torch lacks the API, and the caller degrades.
Checked against torch 2.11 (GPU box) and 2.13 (CPU). Not here: the profiler's privates, whose
single place is :mod:`torchdoctor.instruments._profiler_compat`; the checkpoint reader's names
of torch's rebuild functions (``torch._utils._rebuild_*``): they are strings in a pickle, never
called, and belong to the file format, not to the running torch.

| what | private API | used by |
|---|---|---|
| DataLoader iterator base (data wait) | ``torch.utils.data.dataloader._BaseDataLoaderIter`` | step clock, data source |
| iterator facts | ``it._dataset``, ``_num_workers``, ``_pin_memory``, ``_prefetch_factor``, ``_persistent_workers``, ``_index_sampler`` | :func:`loader_iter_facts` |
| first batch of an iterator | ``it._next_data`` | dist sampler |
| DataLoader workers' base seed | ``it._base_seed`` | :func:`loader_base_seed` (repro's RNG draws) |
| tensor-hashing debug mode | ``torch.utils._debug_mode.DebugMode`` (``log_tensor_hashes``, ``dispatch_hooks``; torch ≥ 2.13) | :func:`debug_mode_class` (repro's op trace) |
| fused norms | ``torch._foreach_norm`` | nan monitor, gradient norms |
| grad mode setter | ``torch._C._set_grad_enabled`` | nan monitor |
| dispatch modes | ``torch.utils._python_dispatch.TorchDispatchMode`` | NaN replay, memory sites |
| saved-tensor hooks on top | ``torch._C._autograd._top_saved_tensors_default_hooks`` | memory saved tensors |
| CUDA allocator | ``torch._C._cuda_memoryStats``, ``_cuda_attach_out_of_memory_observer``, ``torch.cuda.memory._record_memory_history`` / ``_snapshot``, ``torch.cuda._lazy_call`` | :mod:`torchdoctor.memory.cuda` |
| flight recorder | ``torch._C._distributed_c10d`` | dist collectives |
"""

from __future__ import annotations

import sys
from typing import Any


def _torch() -> Any:
    import torch

    return torch


# ---- DataLoader -----------------------------------------------------------------------------
def dataloader_module() -> Any:
    from torch.utils.data import dataloader

    return dataloader


def base_loader_iter() -> Any:
    """The class every DataLoader iterator (single- and multi-process) inherits ``__next__``
    and ``__init__`` from."""
    return dataloader_module()._BaseDataLoaderIter


def loader_iter_facts(it: Any) -> dict[str, Any]:
    """What a DataLoader iterator keeps of its loader (private attributes, absent -> None)."""
    return {"dataset": getattr(it, "_dataset", None),
            "num_workers": getattr(it, "_num_workers", None),
            "pin_memory": bool(getattr(it, "_pin_memory", False)),
            "prefetch_factor": getattr(it, "_prefetch_factor", None),
            "persistent_workers": bool(getattr(it, "_persistent_workers", False)),
            "batch_size": getattr(getattr(it, "_index_sampler", None), "batch_size", None)}


def loader_base_seed(it: Any) -> Any:
    """The base seed a multi-process iterator gives its workers (worker i: base + i), or None."""
    seed = getattr(it, "_base_seed", None)
    return int(seed) if isinstance(seed, int) else None


NEXT_DATA = "_next_data"  # the iterator's method that fetches one batch (after sampling)


# ---- fused ops, grad mode ---------------------------------------------------------------------
def foreach_norm() -> Any:
    """``torch._foreach_norm`` (one fused kernel for many tensors), or None."""
    return getattr(_torch(), "_foreach_norm", None)


def set_grad_enabled_raw() -> Any:
    """``torch._C._set_grad_enabled``: the grad-mode switch without a context manager."""
    return _torch()._C._set_grad_enabled


# ---- dispatch modes ---------------------------------------------------------------------------
def dispatch_mode_base() -> Any:
    """``TorchDispatchMode`` (sees every aten op below autograd)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def debug_mode_class() -> Any:
    """torch's ``DebugMode`` when it can hash tensors op by op (``log_tensor_hashes`` and
    ``dispatch_hooks``, torch 2.13), else None (torch 2.11: use a TorchDispatchMode)."""
    try:
        from torch.utils._debug_mode import DebugMode
    except Exception:  # noqa: BLE001 - absent or broken on this torch
        return None
    if not (hasattr(DebugMode, "log_tensor_hashes") and hasattr(DebugMode, "dispatch_hooks")):
        return None
    return DebugMode


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


# ---- autograd saved tensors -------------------------------------------------------------------
def top_saved_tensors_hooks() -> Any:
    """The innermost (pack, unpack) saved-tensors default hooks, or None."""
    return _torch()._C._autograd._top_saved_tensors_default_hooks(True)


# ---- CUDA allocator ---------------------------------------------------------------------------
def cuda_memory_stats_raw() -> Any:
    """``torch._C._cuda_memoryStats`` (nested stats per device), or None."""
    return getattr(_torch()._C, "_cuda_memoryStats", None)


def cuda_record_memory_history(**kw: Any) -> None:
    _torch().cuda.memory._record_memory_history(**kw)


def cuda_snapshot() -> Any:
    return _torch().cuda.memory._snapshot()


def cuda_attach_oom_observer(cb: Any) -> None:
    _torch()._C._cuda_attach_out_of_memory_observer(cb)


def cuda_lazy_call(fn: Any) -> None:
    _torch().cuda._lazy_call(fn)


# ---- distributed ------------------------------------------------------------------------------
def c10d_private() -> Any:
    """``torch._C._distributed_c10d`` (flight recorder dumps); raises ImportError without it."""
    import torch._C._distributed_c10d as c10d_c

    return c10d_c
