"""Data-side treatments (child): ``dataloader-workers`` and ``pin-memory``.

Both patch ``DataLoader.__init__`` (the class, undone on uninstall) and change the keyword
arguments of each loader as it is built: nothing is edited, the loader the script gets is a
plain DataLoader built with other arguments. ``pin-memory`` also makes ``Tensor.to`` /
``Tensor.cuda`` of a *pinned* CPU tensor to a CUDA device ``non_blocking=True`` when the call
does not say otherwise (the pinned batch is what the loader now yields; a copy from pinned
memory is ordered on the stream, so the script sees the same values).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from torchdoctor.treat.child import Applier, user_site

MAX_WORKERS = 8


def default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(2, min(MAX_WORKERS, cpus))


class _LoaderArgs(Applier):
    """Rewrites DataLoader keyword arguments at construction (subclasses: :meth:`adjust`)."""

    def install(self, ctx: Any) -> None:
        from torch.utils.data import DataLoader

        self.sig = inspect.signature(DataLoader.__init__)
        inst = self

        def make(orig):
            def init(loader, *a, **k):
                if inst.active():
                    try:
                        a, k = inst._rewrite(loader, a, k)
                    except Exception as e:  # noqa: BLE001 - the loader is built as the script asked
                        inst.note(f"DataLoader arguments not changed: {type(e).__name__}: {e}")
                return orig(loader, *a, **k)
            return init

        self.patches.wrap(DataLoader, "__init__", make)

    def _rewrite(self, loader: Any, a: tuple, k: dict) -> tuple[tuple, dict]:
        from torchdoctor.instruments._sites import creation_site

        bound = self.sig.bind(loader, *a, **k)
        args = bound.arguments
        new = self.adjust(args)
        if not new:
            return a, k
        site = creation_site(loader, 3)
        self.change("DataLoader", site, "DataLoader(..., " + ", ".join(f"{n}={v!r}" for n, v in new.items()) + ")")
        args.update(new)
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def adjust(self, args: dict[str, Any]) -> dict[str, Any]:
        return {}


class Workers(_LoaderArgs):
    """num_workers from the cores, persistent workers, prefetch_factor=2 (map-style datasets)."""

    name = "dataloader-workers"

    def adjust(self, args: dict[str, Any]) -> dict[str, Any]:
        from torch.utils.data import IterableDataset

        n = int(self.value) if self.value else default_workers()
        if isinstance(args.get("dataset"), IterableDataset):
            self.note("an IterableDataset's loader is left alone: each worker would yield the "
                      "whole stream unless the dataset shards by get_worker_info()")
            return {}
        if int(args.get("num_workers") or 0) >= n:
            return {}
        return {"num_workers": n, "persistent_workers": True,
                "prefetch_factor": args.get("prefetch_factor") or 2}


class PinMemory(_LoaderArgs):
    """pin_memory=True, and non_blocking copies of pinned tensors to CUDA."""

    name = "pin-memory"

    def adjust(self, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("pin_memory"):
            return {}
        return {"pin_memory": True}

    def install(self, ctx: Any) -> None:
        import torch

        super().install(ctx)
        if not torch.cuda.is_available():
            self.note("no CUDA: nothing to pin for")
            return
        inst = self

        def make_to(orig):
            def to(t, *a, **k):
                if "non_blocking" not in k and len(a) <= 2 and inst.live and _pinned_to_cuda(t, a, k):
                    k["non_blocking"] = True
                    inst._site(".to(")
                return orig(t, *a, **k)
            return to

        def make_cuda(orig):
            def cuda(t, *a, **k):
                if "non_blocking" not in k and len(a) <= 1 and inst.live and _is_pinned(t):
                    k["non_blocking"] = True
                    inst._site(".cuda(")
                return orig(t, *a, **k)
            return cuda

        self.patches.wrap(torch.Tensor, "to", make_to)
        self.patches.wrap(torch.Tensor, "cuda", make_cuda)

    def _site(self, call: str) -> None:
        if len(self.changes) < 8:
            self.change("copy", user_site(3), f"{call}..., non_blocking=True)")


def _is_pinned(t: Any) -> bool:
    try:
        return t.device.type == "cpu" and t.is_pinned()
    except Exception:  # noqa: BLE001
        return False


def _pinned_to_cuda(t: Any, a: tuple, k: dict) -> bool:
    """``t.to(...)`` copies a pinned CPU tensor to a CUDA device, and the call has no
    positional non_blocking (``to(device, dtype, non_blocking)``: three positional args)."""
    import torch

    target = k.get("device", a[0] if a else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    if isinstance(target, int):
        return _is_pinned(t)
    if isinstance(target, str):
        if not target.startswith("cuda"):
            return False
    elif not (isinstance(target, torch.device) and target.type == "cuda"):
        return False
    if len(a) == 2 and not isinstance(a[1], torch.dtype):  # to(device, non_blocking)
        return False
    return _is_pinned(t)


APPLIERS = {"dataloader-workers": Workers, "pin-memory": PinMemory}
