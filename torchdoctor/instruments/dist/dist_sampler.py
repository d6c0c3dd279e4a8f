"""DataLoader facts for the sampler checks of a ranked run (``--nproc-per-node``).

Wraps ``DataLoader.__iter__`` (called once per epoch, also with persistent workers) and
records, per loader and epoch, one ``dist_loader`` event: the sampler's kind
(``sampler_kind``: ``distributed``: a ``DistributedSampler`` or any sampler with ``num_replicas`` and ``rank``;
``stock``: torch's Sequential/Random/SubsetRandom/WeightedRandom sampler, also inside a
``BatchSampler``; ``custom``; ``iterable`` for an ``IterableDataset``), ``shuffle`` and
``epoch`` as the sampler holds them when the epoch's iterator is made (a
``DistributedSampler`` draws its permutation from ``seed + epoch`` right then), the dataset
class and length, batches per epoch, the loop's line, and the process group's size.

For the first epoch of each loader it also records a fingerprint of the first batch
(``dist_batch``): shapes, dtypes and two sums (plain and position-weighted, float64) of the
first 64k elements of each CPU tensor, hashed. Equal fingerprints on every rank mean the
ranks were handed the same samples. It is read from the iterator's own ``_next_data``
(patched on that one iterator instance for one call): no extra sample is read and no
random number is drawn. Cost: one event per loader and epoch, one reduction over the first
batch of each loader.
"""

from __future__ import annotations

import hashlib
from typing import Any

from torchdoctor.instruments.base import Instrument, register

FINGERPRINT_ELEMS = 65536
STOCK_SAMPLERS = ("SequentialSampler", "RandomSampler", "SubsetRandomSampler",
                  "WeightedRandomSampler")


def sampler_facts(loader: Any) -> dict[str, Any]:
    """What kind of sampler feeds ``loader`` (see the module docstring)."""
    from torch.utils.data import IterableDataset, sampler as sampler_mod

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return {"sampler_kind": "iterable", "sampler": None}
    s = getattr(loader, "sampler", None)
    bs = getattr(loader, "batch_sampler", None)
    inner = s
    if bs is not None and type(bs) is not sampler_mod.BatchSampler:
        inner = bs  # a custom batch sampler decides the indices itself
    elif bs is not None:
        inner = getattr(bs, "sampler", s)
    name = type(inner).__name__
    out: dict[str, Any] = {"sampler": name,
                           "batch_sampler": type(bs).__name__ if bs is not None else None}
    if hasattr(inner, "num_replicas") and hasattr(inner, "rank"):
        out.update(sampler_kind="distributed", num_replicas=getattr(inner, "num_replicas", None),
                   sampler_rank=getattr(inner, "rank", None),
                   shuffle=bool(getattr(inner, "shuffle", False)),
                   epoch=getattr(inner, "epoch", None))
    elif type(inner).__module__ == sampler_mod.__name__ and name in STOCK_SAMPLERS:
        out.update(sampler_kind="stock", shuffle=name != "SequentialSampler")
    else:
        out["sampler_kind"] = "custom"
    return out


def fingerprint(batch: Any, torch: Any) -> str | None:
    """A hash of a batch's content (CPU tensors and plain values); None if it has no CPU data."""
    parts: list[Any] = []

    def walk(x: Any, depth: int = 0) -> None:
        if depth > 4 or len(parts) > 64:
            return
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                return
            flat = x.detach().reshape(-1)[:FINGERPRINT_ELEMS]
            v = flat.to(torch.float64)
            w = torch.arange(v.numel(), dtype=torch.float64, device="cpu") % 1009 + 1
            parts.append((tuple(x.shape), str(x.dtype), float(v.sum()), float((v * w).sum())))
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                parts.append(str(k))
                walk(x[k], depth + 1)
        elif isinstance(x, (list, tuple)):
            for y in x[:64]:
                walk(y, depth + 1)
        elif isinstance(x, (str, int, float, bool)):
            parts.append(x if not isinstance(x, str) else x[:200])

    walk(batch)
    if not any(isinstance(p, tuple) for p in parts):
        return None
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


@register
class SamplerWatch(Instrument):
    name = "dist_sampler"
    produces = frozenset({"dist_loader", "dist_batch"})  # inert unless the run is ranked
    priority = 16

    def install(self, ctx: Any) -> None:
        self.undo = None
        if not ctx.options.get("nproc_per_node"):
            return
        import torch
        from torch.utils.data import dataloader as dl_mod

        self.torch = torch
        self.loaders: dict[int, dict[str, Any]] = {}  # id(loader) -> {index, iters}
        self.keep: list[Any] = []  # the loaders themselves, so ids stay unique during the run
        orig = dl_mod.DataLoader.__iter__
        inst = self

        def td_iter(loader):
            it = orig(loader)
            if inst.undo is not None and ctx.in_owner_process():  # inert after teardown
                try:
                    inst._seen(ctx, loader, it)
                except Exception:  # noqa: BLE001 - never break the user's loop
                    import traceback

                    ctx.emit("instrument_error", instrument=inst.name, callback="DataLoader.__iter__",
                             traceback=traceback.format_exc(limit=6))
            return it

        from torchdoctor.runner.patching import Patches

        self.undo = Patches()  # undone only where our wrapper is still on top
        self.undo.set(dl_mod.DataLoader, "__iter__", td_iter, orig)

    def _seen(self, ctx: Any, loader: Any, it: Any) -> None:
        from torchdoctor.runner.frames import user_frame

        state = self.loaders.get(id(loader))
        if state is None:
            state = self.loaders[id(loader)] = {"index": len(self.loaders), "iters": 0}
            self.keep.append(loader)
        state["iters"] += 1
        facts = sampler_facts(loader)
        ds = getattr(loader, "dataset", None)
        try:
            ds_len = len(ds)
        except Exception:  # noqa: BLE001 - iterable datasets without __len__
            ds_len = None
        try:
            batches = len(loader)
        except Exception:  # noqa: BLE001
            batches = None
        world = rank = None
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
        loop = user_frame(3)
        ctx.emit("dist_loader", loader=state["index"], iter=state["iters"], step=ctx.step,
                 site=f"{loop[0]}:{loop[1]}" if loop else None,
                 dataset=type(ds).__name__ if ds is not None else None, dataset_len=ds_len,
                 batches=batches, world_size=world, rank=rank, **facts)
        if state["iters"] == 1 and facts["sampler_kind"] != "iterable":
            self._fingerprint_first_batch(ctx, it, state["index"])

    def _fingerprint_first_batch(self, ctx: Any, it: Any, index: int) -> None:
        from torchdoctor.torch_internals import NEXT_DATA

        orig_next = getattr(it, NEXT_DATA)
        torch = self.torch

        def first(*a, **k):
            try:
                delattr(it, NEXT_DATA)  # back to the class's method for every later batch
            except AttributeError:
                pass
            data = orig_next(*a, **k)
            try:
                ctx.emit("dist_batch", loader=index, fingerprint=fingerprint(data, torch))
            except Exception:  # noqa: BLE001
                pass
            return data

        from torchdoctor.runner.patching import passthrough

        setattr(it, NEXT_DATA, passthrough(first))  # one batch only, on this iterator (undoes itself)

    def uninstall(self, ctx: Any) -> None:
        if self.undo is not None:
            self.undo.undo()
            self.undo = None
            self.keep = []
