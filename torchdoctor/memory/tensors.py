"""Bytes held by parameters, gradients and optimizer state, measured on the real tensors.

Walks the models the harness saw in forward and the optimizers it saw stepping; each
storage is counted once (views, tied weights and flat buffers share storages), in the
first category that claims it: parameters (and buffers) > gradients > optimizer state.
Cost: O(number of tensors) Python work, so it runs at a chosen step or at a crash only,
never on every step.
"""

from __future__ import annotations

from typing import Any, Iterable

CATEGORIES = ("parameters", "gradients", "optimizer_state")


def _iter_state_tensors(obj: Any, depth: int = 0) -> Iterable[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, dict):
        for v in obj.values():
            yield from _iter_state_tensors(v, depth + 1)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _iter_state_tensors(v, depth + 1)


def storage_key(t: Any) -> tuple[int, bool] | None:
    try:
        st = t.untyped_storage()
        return (st.data_ptr(), t.is_cuda)
    except Exception:  # noqa: BLE001 - meta, sparse, fake tensors
        return None


class Accounting:
    """Per-category bytes and storage keys, optionally restricted to one device type."""

    def __init__(self, models: Iterable[Any], optimizers: Iterable[Any], cuda: bool | None = None):
        self.cuda = cuda
        self.bytes = {c: 0 for c in CATEGORIES}
        self.keys: dict[tuple[int, bool], str] = {}
        self.fp32_param_bytes = 0
        self.n_params = 0
        models, optimizers = list(models), list(optimizers)
        params = []
        for m in models:
            try:
                params.extend(m.parameters())
                for b in m.buffers():
                    self._add(b, "parameters")
            except Exception:  # noqa: BLE001
                continue
        for opt in optimizers:
            for g in getattr(opt, "param_groups", ()):
                params.extend(g.get("params", ()))
        for p in params:
            if self._add(p, "parameters"):
                self.n_params += p.numel()
                if str(p.dtype) == "torch.float32":
                    self.fp32_param_bytes += p.untyped_storage().nbytes()
        for p in params:
            g = getattr(p, "grad", None)
            if g is not None:
                self._add(g, "gradients")
        for opt in optimizers:
            for st in getattr(opt, "state", {}).values():
                for t in _iter_state_tensors(st):
                    self._add(t, "optimizer_state")

    def _add(self, t: Any, cat: str) -> bool:
        if self.cuda is not None and bool(getattr(t, "is_cuda", False)) != self.cuda:
            return False
        key = storage_key(t)
        if key is None or key in self.keys:
            return False
        self.keys[key] = cat
        self.bytes[cat] += t.untyped_storage().nbytes()
        return True

    def addresses(self) -> dict[int, str]:
        """data_ptr -> category (to label allocator blocks of a snapshot)."""
        return {k[0]: c for k, c in self.keys.items()}


def other_tensor_bytes(exclude: set, cuda: bool) -> tuple[int, int]:
    """(bytes, storages) of tensors reachable from Python (``gc``) on CUDA or the CPU whose
    storage is not in ``exclude``: inputs, outputs kept, datasets, caches. One scan of the
    garbage collector's objects (tens of ms in a large program): run once, never per step."""
    import gc

    import torch

    seen: set = set()
    total = 0
    tensor = torch.Tensor
    for o in gc.get_objects():
        t = type(o)  # not isinstance: it reads __class__, which lazy modules answer with warnings
        if t is not tensor and not issubclass(t, tensor):
            continue
        try:
            if bool(o.is_cuda) != cuda or o.is_meta:
                continue
            st = o.untyped_storage()
            key = (st.data_ptr(), cuda)
            if key in exclude or key in seen:
                continue
            seen.add(key)
            total += st.nbytes()
        except Exception:  # noqa: BLE001 - sparse, fake, subclass tensors
            continue
    return total, len(seen)


def param_keys(models: Iterable[Any]) -> list[tuple[int, bool]]:
    """Storage keys of every parameter and buffer of ``models`` (to tell them from activations)."""
    keys = []
    for m in models:
        try:
            for t in list(m.parameters()) + list(m.buffers()):
                k = storage_key(t)
                if k is not None:
                    keys.append(k)
        except Exception:  # noqa: BLE001
            continue
    return keys


def child_count(models: Iterable[Any]) -> int:
    """Direct children with parameters of the largest root model (checkpointing granularity)."""
    best = 0
    for m in models:
        try:
            n = sum(1 for c in m.children() if any(True for _ in c.parameters()))
            # a single container child (e.g. Sequential body): look one level deeper
            kids = [c for c in m.children()]
            if n == 1 and len(kids) == 1:
                n = sum(1 for c in kids[0].children() if any(True for _ in c.parameters()))
            best = max(best, n)
        except Exception:  # noqa: BLE001
            continue
    return best
