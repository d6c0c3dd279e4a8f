"""The one place that touches CUDA allocator APIs, private ones included (feature-detected).

Every function returns None / False / {} instead of raising when CUDA, a device, or an API
is missing: the CPU build has ``torch.cuda.memory._record_memory_history`` but it raises
AttributeError, and ``memory_allocated()`` silently returns 0 there. Nothing here
initializes a CUDA context the script did not create (``torch.cuda.is_initialized()`` gates
every per-device call) and nothing synchronizes the device: allocator statistics are host-side.

Private APIs used (torch 2.11 on the GPU box, 2.13 on the CPU box):
``torch._C._cuda_memoryStats`` (nested stats, cheaper than the flattened public dict),
``torch.cuda.memory._record_memory_history`` / ``_dump_snapshot`` (memory_viz files),
``torch.cuda.memory.memory_snapshot(include_traces=False)`` (segments only, fast),
``torch._C._cuda_attach_out_of_memory_observer`` (called before the OOM unwinds; cannot be
detached, so the callback checks a flag).
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable


def _torch():
    import torch

    return torch


def available() -> bool:
    """CUDA usable by this torch build (does not create a context)."""
    try:
        return bool(_torch().cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def initialized() -> bool:
    """A CUDA context exists in this process (the script has touched the GPU)."""
    try:
        t = _torch()
        return bool(t.cuda.is_initialized())  # False without CUDA; no is_available() probe
    except Exception:  # noqa: BLE001
        return False


def device_count() -> int:
    try:
        return int(_torch().cuda.device_count()) if available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _nested(device: int) -> dict[str, Any]:
    from torchdoctor.torch_internals import cuda_memory_stats_raw

    fn = cuda_memory_stats_raw()
    if fn is not None:
        return fn(device)
    return _torch().cuda.memory_stats_as_nested_dict(device)


def stats(device: int) -> dict[str, int] | None:
    """Allocator statistics of ``device`` in bytes, or None before the script used it.

    Keys: allocated, reserved (current), peak_allocated, peak_reserved (since start or the
    script's own reset), inactive_split (reserved, free, but split: not releasable),
    alloc_retries (cudaMalloc failures that flushed the cache), ooms.
    """
    if not initialized():
        return None
    try:
        s = _nested(device)
        if not s:
            return None
        ab, rb = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
        return {
            "allocated": int(ab["current"]),
            "reserved": int(rb["current"]),
            "peak_allocated": int(ab["peak"]),
            "peak_reserved": int(rb["peak"]),
            "inactive_split": int(s.get("inactive_split_bytes", {}).get("all", {}).get("current", 0)),
            "alloc_retries": int(s.get("num_alloc_retries", 0)),
            "ooms": int(s.get("num_ooms", 0)),
        }
    except Exception:  # noqa: BLE001
        return None


def devices_in_use() -> list[int]:
    """Indices of devices on which the allocator holds memory."""
    if not initialized():
        return []
    out = []
    for d in range(device_count()):
        s = stats(d)
        if s and (s["reserved"] or s["peak_reserved"]):
            out.append(d)
    return out


def device_info(device: int) -> dict[str, Any] | None:
    try:
        p = _torch().cuda.get_device_properties(device)
        return {"index": device, "name": p.name, "capacity": int(p.total_memory)}
    except Exception:  # noqa: BLE001
        return None


def mem_get_info(device: int) -> tuple[int, int] | None:
    """(free, total) bytes as the driver sees them; only with an existing context."""
    if not initialized():
        return None
    try:
        free, total = _torch().cuda.mem_get_info(device)
        return int(free), int(total)
    except Exception:  # noqa: BLE001
        return None


def alloc_conf() -> str:
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or os.environ.get("PYTORCH_ALLOC_CONF", "")


# ---- memory history (allocation stacks) ------------------------------------------------

def start_history(mode: str = "all", max_entries: int = 20000) -> bool:
    """Record allocation stacks (Python frames only). ``mode``: "all" keeps an alloc/free
    trace for memory_viz's timeline, "state" only the stacks of live blocks (cheaper)."""
    if not available():
        return False
    try:
        context = "alloc" if mode == "all" else "state"
        from torchdoctor.torch_internals import cuda_record_memory_history

        cuda_record_memory_history(enabled=mode, context=context, stacks="python",
                                   max_entries=int(max_entries))
        return True
    except Exception:  # noqa: BLE001
        return False


def stop_history() -> None:
    try:
        from torchdoctor.torch_internals import cuda_record_memory_history

        cuda_record_memory_history(enabled=None)
    except Exception:  # noqa: BLE001
        pass


def segments() -> list[dict[str, Any]] | None:
    """Allocator segments with their blocks (and block frames when history is on); no trace."""
    if not initialized():
        return None
    mem = _torch().cuda.memory
    try:
        return list(mem.memory_snapshot(include_traces=False))
    except TypeError:
        pass
    except Exception:  # noqa: BLE001
        return None
    try:
        return list(mem.memory_snapshot())
    except Exception:  # noqa: BLE001
        return None


def snapshot() -> dict[str, Any] | None:
    """The full private snapshot (segments + device_traces), as memory_viz reads it."""
    if not initialized():
        return None
    try:
        from torchdoctor.torch_internals import cuda_snapshot

        return cuda_snapshot()
    except Exception:  # noqa: BLE001
        return None


def dump_snapshot(path: str | os.PathLike, snap: dict[str, Any] | None = None) -> bool:
    """Write a pickled snapshot for pytorch.org/memory_viz; False if none could be taken."""
    snap = snap if snap is not None else snapshot()
    if snap is None:
        return False
    try:
        with open(path, "wb") as f:
            pickle.dump(snap, f)
        return True
    except Exception:  # noqa: BLE001
        return False


def attach_oom_observer(cb: Callable[[int, int, int, int], None]) -> bool:
    """``cb(device, requested, device_allocated, device_free)`` runs when the allocator is
    about to raise OutOfMemoryError, before the stack unwinds. Cannot be detached."""
    if not available():
        return False
    try:
        from torchdoctor.torch_internals import cuda_attach_oom_observer

        cuda_attach_oom_observer(cb)
        return True
    except Exception:  # noqa: BLE001
        return False


def on_init(fn: Callable[[], None]) -> bool:
    """Run ``fn`` when the script first initializes CUDA (now if it already has), before its
    first allocation; never raises into torch's lazy init. False if CUDA is unavailable."""
    if not available():
        return False

    def safe() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a failure here must not break the user's CUDA init
            pass

    try:
        from torchdoctor.torch_internals import cuda_lazy_call

        cuda_lazy_call(safe)
        return True
    except Exception:  # noqa: BLE001
        return False
