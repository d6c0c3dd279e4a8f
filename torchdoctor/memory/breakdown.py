"""What is live right now, by part: parameters, gradients, optimizer state, activations, other.

* parameters / gradients / optimizer state: the real tensors of the models and optimizers
  the harness saw (:class:`torchdoctor.memory.tensors.Accounting`);
* activations: tensors saved for backward that are alive (:mod:`torchdoctor.memory.saved`,
  memory probe only), minus parameter storages;
* other: on CUDA the allocator's allocated bytes minus the parts above (inputs, outputs,
  temporaries, caches: every live block is a tensor); on the CPU the Python-reachable tensors
  not in the parts above (one ``gc`` scan), since the C heap also holds non-tensor memory.

Runs once (breakdown step, OOM), never per step.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.memory.tensors import Accounting, child_count, other_tensor_bytes


def live_breakdown(models: list[Any], optimizers: list[Any], saved: Any, on_cuda: bool,
                   allocated: int | None = None) -> dict[str, Any]:
    """{"parts": {...bytes}, "total", "activations_fp32", "fp32_param_bytes", "n_blocks",
    "addresses": {data_ptr: part}} (addresses label allocator blocks of a snapshot)."""
    acc = Accounting(models, optimizers, cuda=on_cuda)
    parts: dict[str, int] = dict(acc.bytes)
    act32 = 0
    saved_keys: set = set()
    if saved is not None:
        parts["activations"], act32 = saved.live_bytes(on_cuda, list(acc.keys))
        saved_keys = saved.keys()
    known = sum(parts.values())
    if on_cuda:
        if allocated is not None:
            parts["other"] = max(0, allocated - known)
        total = allocated
    else:
        parts["other"] = other_tensor_bytes(set(acc.keys) | saved_keys, cuda=False)[0]
        total = sum(parts.values())
    addresses = acc.addresses()
    for k in saved_keys:
        if k[1] == on_cuda:
            addresses.setdefault(k[0], "activations")
    return {"parts": parts, "total": total, "activations_fp32": act32,
            "fp32_param_bytes": acc.fp32_param_bytes, "n_blocks": child_count(models),
            "addresses": addresses}
