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
| fused norms | ``torch._foreach_norm`` | nan monitor, gradient norms |
| grad mode setter | ``torch._C._set_grad_enabled`` | nan monitor |
| dispatch modes | ``torch.utils._python_dispatch.TorchDispatchMode`` | NaN replay, memory sites |
| the innermost dispatch mode | ``torch.utils._python_dispatch._get_current_dispatch_mode`` | FLOP count (leaves only its own mode) |
| graphs compiled by dynamo | ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` | FLOP count (no count under torch.compile) |
| saved-tensor hooks on top | ``torch._C._autograd._top_saved_tensors_default_hooks`` | memory saved tensors |
| CUDA allocator | ``torch._C._cuda_memoryStats``, ``_cuda_attach_out_of_memory_observer``, ``torch.cuda.memory._record_memory_history`` / ``_snapshot``, ``torch.cuda._lazy_call`` | :mod:`torchdoctor.memory.cuda` |
| flight recorder | ``torch._C._distributed_c10d`` | dist collectives |
| compile start/end callbacks | ``torch._dynamo.callback.callback_handler`` (``register_start_callback``…) | ``treat``'s compile trial |
| custom ops | ``torch._library.custom_ops.CustomOpDef`` (``__call__``, ``_qualname``, ``_init_fn``, ``_backward_fn``) | gradcheck capture |
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


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def current_dispatch_mode() -> Any:
    """The innermost active TorchDispatchMode of this thread, or None (None also where the
    running torch lacks the accessor: callers then treat the stack as unknown)."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:
        return None
    return _get_current_dispatch_mode()


def dynamo_graphs_compiled() -> int | None:
    """Graphs dynamo has compiled in this process (0 when dynamo was never imported), or None
    when the running torch keeps no such counter."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"].get("unique_graphs", 0))
    except Exception:  # noqa: BLE001 - a torch without the counter: unknown
        return None


class _CompileCallbacks:
    def __init__(self, handler: Any):
        self.handler = handler
        self.added: tuple[Any, Any] | None = None

    def add(self, start: Any, end: Any) -> None:
        self.handler.register_start_callback(start)
        self.handler.register_end_callback(end)
        self.added = (start, end)

    def remove(self) -> None:
        if self.added is None:
            return
        start, end, self.added = *self.added, None
        for fn, rm in ((start, "remove_start_callback"), (end, "remove_end_callback")):
            try:
                getattr(self.handler, rm)(fn)
            except Exception:  # noqa: BLE001 - already gone
                pass


def compile_callbacks() -> Any:
    """Callbacks at the start and end of each torch.compile compilation (dynamo, the lazy
    backward): an object with ``add(start, end)`` and ``remove()``, or None without them."""
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:  # noqa: BLE001
        return None
    needed = ("register_start_callback", "register_end_callback", "remove_start_callback",
              "remove_end_callback")
    if not all(hasattr(callback_handler, n) for n in needed):
        return None
    return _CompileCallbacks(callback_handler)


# ---- autograd saved tensors -------------------------------------------------------------------
def top_saved_tensors_hooks() -> Any:
    """The innermost (pack, unpack) saved-tensors default hooks, or None."""
    return _torch()._C._autograd._top_saved_tensors_default_hooks(True)


# ---- custom ops (torch.library.custom_op) -------------------------------------------------------
def custom_op_def_class() -> Any:
    """The class of the objects ``torch.library.custom_op`` returns, or None."""
    try:
        from torch._library.custom_ops import CustomOpDef
    except Exception:  # noqa: BLE001
        return None
    return CustomOpDef if callable(getattr(CustomOpDef, "__call__", None)) else None


def custom_op_facts(op: Any) -> dict[str, Any]:
    """{"name", "fn", "backward"} of a CustomOpDef (None where the torch lacks the field)."""
    return {"name": getattr(op, "_qualname", None) or repr(op), "fn": getattr(op, "_init_fn", None),
            "backward": getattr(op, "_backward_fn", None)}


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
