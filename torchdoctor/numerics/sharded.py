"""Gradient norms of sharded parameters (FSDP2 ``fully_shard``, tensor parallelism): the norm of
the full gradients, as ``torch.nn.utils.clip_grad_norm_`` computes it, from local shards.
FSDP1 (``FullyShardedDataParallel``) too: its flat parameters (and the original parameters
viewing into them) are plain tensors holding this rank's shard, summed over the FSDP unit's
process group (``torch_internals.fsdp1_shard_groups``).

A DTensor gradient is read through its local shard only (``torch_internals.local_tensor``: no
copy, no collective). Its share of the full squared norm is ``weight * |local|^2`` summed over
the ranks of its mesh (``torch_internals.dtensor_norm_share``: a Shard placement splits the
elements, a Replicate one repeats them). :class:`ShardedNorm` adds those shares per mesh and sums
them with one all-reduce per mesh dimension, over that dimension's own process group (never the
default group: the ranks of a sub-mesh are not the world, and a collective on a group that other
ranks do not enter hangs). Plain tensors count once, as on one rank (DDP's gradients are
identical on every rank after its all-reduce).

The sum is taken at the optimizer pre-step, which every rank of the mesh reaches in the same
order (FSDP2 and tensor parallelism step every rank); on CUDA the all-reduce is enqueued on the
current stream like the rest of the row (no host sync). A non-finite shard makes the sum
non-finite on every rank, so all ranks see the same verdict at the same row.
"""

from __future__ import annotations

import math
from typing import Any


class ShardedNorm:
    """The gradients of one row: which are DTensor shards, grouped by mesh (in first-seen order,
    the same on every rank: parameters come in the optimizer's order)."""

    __slots__ = ("meshes", "partial")

    def __init__(self) -> None:
        self.meshes: dict[Any, list[tuple[int, float]]] = {}  # mesh -> [(grad index, weight)]
        self.partial: list[int] = []  # grads with a Partial placement: finiteness only

    def add(self, i: int, share: tuple[Any, float] | None, mesh: Any) -> None:
        if share is None:
            self.meshes.setdefault(mesh, [])
            self.partial.append(i)
            self.meshes[mesh].append((i, 0.0))
        else:
            self.meshes.setdefault(share[0], []).append((i, share[1]))

    def group(self, key: Any) -> None:
        """A group every rank sums over in this row even when none of its gradients is here
        (FSDP1 with use_orig_params: a rank holds no part of some parameters)."""
        self.meshes.setdefault(key, [])

    def __bool__(self) -> bool:
        return bool(self.meshes)

    def _sharded(self) -> set[int]:
        return {i for items in self.meshes.values() for i, _w in items}

    def total_cpu(self, torch: Any, norms: list[float]) -> float:
        """The full gradients' L2 norm from per-gradient local norms (Python floats): plain ones
        summed here, each mesh's weighted squares all-reduced over its groups (float64)."""
        from torchdoctor.torch_internals import mesh_groups

        sharded = self._sharded()
        sq = math.fsum(n * n for i, n in enumerate(norms) if i not in sharded)
        for mesh, items in self.meshes.items():
            part = math.fsum(_weighted(norms[i], w) for i, w in items)
            t = torch.tensor([part], dtype=torch.float64, device=_mesh_device(torch, mesh))
            for g in mesh_groups(mesh):
                torch.distributed.all_reduce(t, group=g)
            sq += float(t[0]) if t.device.type == "cpu" else t.item()
        return math.sqrt(sq) if sq >= 0 else sq  # NaN stays NaN

    def total_dev(self, torch: Any, norms: Any) -> Any:
        """Same as :meth:`total_cpu` for a device tensor of per-gradient norms: a 0-dim float64
        tensor on ``norms``' device, no host sync."""
        from torchdoctor.torch_internals import mesh_groups

        sq = norms.double().square()
        sharded = self._sharded()
        plain = [i for i in range(len(sq)) if i not in sharded]
        total = sq[plain].sum() if plain else sq.new_zeros(())
        for mesh, items in self.meshes.items():
            if items:
                idx, w = _index_weights(torch, items, sq.device)
                part = (sq.index_select(0, idx) * w).sum().reshape(1)  # weight 0: Partial (NaN kept)
            else:
                part = sq.new_zeros(1)
            for g in mesh_groups(mesh):
                torch.distributed.all_reduce(part, group=g)
            total = total + part[0]
        return total.sqrt()


_INDEX_CACHE: dict[tuple, tuple[Any, Any]] = {}  # (device, items) -> (index, weights) on the device
MAX_CACHED = 16


def _index_weights(torch: Any, items: list[tuple[int, float]], device: Any) -> tuple[Any, Any]:
    """The gradient indices and weights of one mesh as device tensors, made once per layout (the
    same every step): no host-to-device copy in the step after the first."""
    key = (str(device), tuple(items))
    got = _INDEX_CACHE.get(key)
    if got is None:
        if len(_INDEX_CACHE) >= MAX_CACHED:
            _INDEX_CACHE.clear()
        got = _INDEX_CACHE[key] = (
            torch.tensor([i for i, _w in items], device=device),
            torch.tensor([x for _i, x in items], dtype=torch.float64, device=device))
    return got


def _weighted(n: float, w: float) -> float:
    if w == 0.0:  # a Partial gradient: its value is not an element, its NaN/Inf still counts
        return n * 0.0
    return w * n * n


def _mesh_device(torch: Any, mesh: Any) -> Any:
    kind = getattr(mesh, "device_type", "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    mod = getattr(torch, kind, None)
    idx = mod.current_device() if mod is not None and hasattr(mod, "current_device") else None
    return torch.device(kind, idx) if idx is not None else torch.device(kind)
