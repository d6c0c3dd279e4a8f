"""Every private torch API torchdoctor touches, in one place: a torch upgrade touches this file.

Lazy (importing this module imports no torch) and feature-detected: each accessor returns
``None`` (or a neutral value) where the running torch lacks the API, and the caller degrades.
Checked against torch 2.11 (GPU box) and 2.13 (CPU). Not here: the profiler's privates, whose
single place is :mod:`torchdoctor.instruments.profile._profiler_compat`; the checkpoint reader's names
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
| the innermost dispatch mode | ``torch.utils._python_dispatch._get_current_dispatch_mode`` | FLOP count (leaves only its own mode) |
| graphs compiled by dynamo | ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` | FLOP count (no count under torch.compile) |
| saved-tensor hooks on top | ``torch._C._autograd._top_saved_tensors_default_hooks`` | memory saved tensors |
| CUDA allocator | ``torch._C._cuda_memoryStats``, ``_cuda_attach_out_of_memory_observer``, ``torch.cuda.memory._record_memory_history`` / ``_snapshot``, ``torch.cuda._lazy_call`` | :mod:`torchdoctor.memory.cuda` |
| flight recorder | ``torch._C._distributed_c10d`` | dist collectives |
| FSDP1 flat parameters' shard group | ``FullyShardedDataParallel._handle`` (``flat_param``, ``process_group``, ``uses_sharded_strategy``), ``flat_param._params`` | :func:`fsdp1_shard_groups` (nan monitor) |
| DTensor shards (FSDP2, tensor parallel) | ``DTensor._local_tensor`` (``to_local()`` where absent), the class's module (``torch.distributed.tensor._api``; ``torch.distributed._tensor.api`` before 2.5) | :func:`local_tensor`, :func:`dtensor_norm_share` (nan monitor, gradient norms, parameter audits) |
| compile start/end callbacks | ``torch._dynamo.callback.callback_handler`` (``register_start_callback``…) | ``treat``'s compile trial |
| custom ops | ``torch._library.custom_ops.CustomOpDef`` (``__call__``, ``_qualname``, ``_init_fn``, ``_backward_fn``) | gradcheck capture |
| dynamo counters, compile records | ``torch._dynamo.utils.counters``, ``get_compilation_metrics``, ``compilation_time_metrics``, ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before 2.6) | dynamo diagnostics, dynamo counters |
| the compiled-module wrapper | ``torch._dynamo.eval_frame.OptimizedModule`` | user hooks (a wrapper rebuilt from ``_orig_mod`` by its ``__reduce__``) |
| dynamo's log channels | the ``graph_breaks`` / ``recompiles`` artifact loggers (``torch._dynamo.<module>.__<artifact>``), ``torch._logging._internal.log_state`` / ``log_registry`` | dynamo diagnostics |
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
# ---- torch.compile (dynamo) -------------------------------------------------------------------
# The artifact loggers dynamo writes its graph-break and recompile reasons to (torch 2.4–2.13):
# created here by name before dynamo is imported, so the first compile is seen too.
DYNAMO_ARTIFACT_LOGGERS = {
    "graph_breaks": ("torch._dynamo.symbolic_convert.__graph_breaks",
                     "torch._dynamo.convert_frame.__graph_breaks"),
    "recompiles": ("torch._dynamo.guards.__recompiles",),
}
# the logger of the "torch._dynamo hit config.recompile_limit (8)" warning
DYNAMO_LIMIT_LOGGER = "torch._dynamo.convert_frame"


def dynamo_artifact_loggers(artifact: str) -> list[str]:
    """The qualified names of dynamo's loggers for ``artifact`` ("graph_breaks", "recompiles"):
    the known names plus those the running torch registered (when torch._logging has a registry)."""
    names = list(DYNAMO_ARTIFACT_LOGGERS.get(artifact, ()))
    mod = sys.modules.get("torch._logging._internal")
    reg = getattr(mod, "log_registry", None)
    try:
        for q in sorted(getattr(reg, "artifact_log_qnames", ()) or ()):
            if q.startswith("torch._dynamo.") and q.endswith(f".__{artifact}") and q not in names:
                names.append(q)
    except Exception:  # noqa: BLE001 - another registry layout: the known names
        pass
    return names


def dynamo_artifact_enabled(artifact: str) -> bool:
    """True when the user switched the artifact on (``TORCH_LOGS`` / ``set_logs``)."""
    mod = sys.modules.get("torch._logging._internal")
    state = getattr(mod, "log_state", None)
    try:
        return bool(state.is_artifact_enabled(artifact))
    except Exception:  # noqa: BLE001
        return False


def dynamo_counters() -> Any:
    """``torch._dynamo.utils.counters`` ({group: Counter}), or None before dynamo is imported."""
    if "torch._dynamo" not in sys.modules:
        return None
    utils = sys.modules.get("torch._dynamo.utils")
    return getattr(utils, "counters", None)


def dynamo_compilation_records() -> list[Any] | None:
    """Dynamo's records of its recent compiles (``CompilationMetrics``, newest last; a bounded
    deque in torch), or None where the running torch has none."""
    utils = sys.modules.get("torch._dynamo.utils")
    fn = getattr(utils, "get_compilation_metrics", None)
    if fn is None:
        return None
    try:
        return list(fn())
    except Exception:  # noqa: BLE001
        return None


def dynamo_compile_time_entries() -> int | None:
    """How many timed compile phases dynamo has recorded (``compilation_time_metrics``): grows
    whenever something is compiled, forward or backward."""
    utils = sys.modules.get("torch._dynamo.utils")
    ctm = getattr(utils, "compilation_time_metrics", None)
    if not isinstance(ctm, dict):
        return None
    try:
        return sum(len(v) for v in list(ctm.values()))
    except Exception:  # noqa: BLE001
        return None


def dynamo_compiled_anything() -> bool:
    """True once dynamo has tried to compile a frame in this process (cheap: a counter read)."""
    c = dynamo_counters()
    try:
        return bool(c is not None and (c.get("frames") or {}).get("total", 0))
    except Exception:  # noqa: BLE001
        return False


def dynamo_wrapper_class() -> Any:
    """``torch._dynamo.eval_frame.OptimizedModule`` (what ``torch.compile(module)`` returns), or
    None before dynamo is imported."""
    ef = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(ef, "OptimizedModule", None)


def dynamo_recompile_limit() -> tuple[str, int] | None:
    """(config name, value) of dynamo's per-function recompile limit, or None."""
    cfg = sys.modules.get("torch._dynamo.config")
    for name in ("recompile_limit", "cache_size_limit"):
        v = getattr(cfg, name, None)
        if isinstance(v, int):
            return name, v
    return None


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


# ---- DTensor (FSDP2 ``fully_shard``, tensor parallelism, device meshes), FSDP1 flat params -----
# Mixing a DTensor with a plain tensor raises; reducing one may run a collective (a hang when only
# some ranks reach it): read local shards, reduce over the tensor's own mesh groups (numerics/sharded).
_DTENSOR_MODULES = ("torch.distributed.tensor._api", "torch.distributed._tensor.api")  # 2.5+, 2.0-2.4
_DTENSOR: list[Any] = []  # [class] once found


def dtensor_class() -> Any:
    """torch's DTensor class, or None while no DTensor module is imported (nothing imported here)."""
    if _DTENSOR:
        return _DTENSOR[0]
    for name in _DTENSOR_MODULES:
        cls = getattr(sys.modules.get(name), "DTensor", None)
        if isinstance(cls, type):
            _DTENSOR.append(cls)
            return cls
    return None


def is_dtensor(t: Any) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: Any) -> Any:
    """A DTensor's local shard (same storage and version counter; no copy, no collective)."""
    if not is_dtensor(t):
        return t
    lt = getattr(t, "_local_tensor", None)
    return t.to_local() if lt is None else lt


def dtensor_layout(t: Any) -> dict[str, Any] | None:
    """{placements, mesh_shape, mesh_dims, local_shape} of a DTensor (evidence), else None."""
    if not is_dtensor(t):
        return None
    try:
        mesh = t.device_mesh
        return {"placements": [str(p) for p in t.placements], "mesh_shape": list(mesh.shape),
                "mesh_dims": list(getattr(mesh, "mesh_dim_names", None) or []),
                "local_shape": list(local_tensor(t).shape)}
    except Exception:  # noqa: BLE001 - another DTensor layout: no facts
        return None


def dtensor_norm_share(t: Any) -> tuple[Any, float] | None:
    """(mesh, weight): the full squared L2 norm = sum over the mesh's ranks of ``weight *
    |local|^2``. Shard (and ``_StridedShard``, whose ``is_shard()`` is False) splits elements,
    Replicate repeats them (weight / size); None for a plain tensor and for Partial."""
    if not is_dtensor(t):
        return None
    mesh, weight = t.device_mesh, 1.0
    for i, p in enumerate(t.placements):
        if p.is_replicate():
            weight /= mesh.size(i)
        elif p.is_partial():
            return None
    return mesh, weight


def mesh_groups(mesh: Any) -> list[Any]:
    """Groups of ``mesh``'s dimensions of > 1 rank (all-reduces over each in turn sum over the mesh's ranks); a process group (FSDP1's) is its own."""
    if not hasattr(mesh, "get_group"):
        return [mesh]
    return [mesh.get_group(i) for i in range(mesh.ndim) if mesh.size(i) > 1]


def fsdp1_shard_groups(roots: Any) -> dict[int, Any]:
    """{id(param): group its gradient is sharded over} for FSDP1 modules under ``roots``: flat
    params and the originals viewing into them (use_orig_params); NO_SHARD left out. Private:
    ``module._handle`` (flat_param, process_group, uses_sharded_strategy), ``flat_param._params``."""
    mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    fsdp = getattr(mod, "FullyShardedDataParallel", None)
    out: dict[int, Any] = {}
    for root in roots if fsdp is not None else ():
        for m in root.modules():
            h = getattr(m, "_handle", None) if isinstance(m, fsdp) else None
            fp, pg = getattr(h, "flat_param", None), getattr(h, "process_group", None)
            if fp is not None and pg is not None and getattr(h, "uses_sharded_strategy", False):
                for p in [fp, *(getattr(fp, "_params", None) or [])]:
                    out.setdefault(id(p), pg)
    return out
