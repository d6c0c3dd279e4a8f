"""The patches through which the step clock sees the training loop (installed by
:class:`torchdoctor.runner.core.Core`, undone with its :class:`~torchdoctor.runner.patching.Patches`):

* ``Optimizer.__init__``: counts the optimizers each thread builds (the cycle of several);
* ``torch.autograd.backward`` and ``Tensor.backward`` (the latter calls the former; the core's
  depth counter keeps one outermost backward): backward begin/end;
* the DataLoader iterators' common ``__next__`` (single- and multi-process ones inherit it):
  data wait, ``on_batch``, the ``dataloader`` event once per iterator;
* global forward pre/post hooks (removed after discovery for per-root hooks).

Every wrapper is inert once the core is closed (its hooks return at once), so one left under
somebody else's later patch at teardown does nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torchdoctor.runner.patching import Patches

_perf = time.perf_counter
_get_ident = threading.get_ident


def install_loop_patches(core: Any, patches: Patches) -> None:
    import torch
    from torch.optim import optimizer as optim_mod

    from torchdoctor.torch_internals import base_loader_iter

    def make_opt_init(orig_init):
        def opt_init(opt, *a, **k):
            orig_init(opt, *a, **k)
            if core.ctx.in_owner_process():
                core.n_optimizers_built += 1
                tid = _get_ident()
                core.built_by[tid] = core.built_by.get(tid, 0) + 1
        return opt_init

    patches.wrap(optim_mod.Optimizer, "__init__", make_opt_init)

    def make_autograd_backward(orig_ab):
        def autograd_backward(*a, **k):
            # the tensor being backpropagated (nan/training instruments)
            mine = core._bwd_begin(a[0] if a else k.get("tensors"))
            try:
                return orig_ab(*a, **k)
            finally:
                core._bwd_end(mine)
        return autograd_backward

    def make_tensor_backward(orig_tb):
        def tensor_backward(self_t, *a, **k):
            mine = core._bwd_begin(self_t)
            try:
                return orig_tb(self_t, *a, **k)
            finally:
                core._bwd_end(mine)
        return tensor_backward

    patches.wrap(torch.autograd, "backward", make_autograd_backward)
    patches.wrap(torch.Tensor, "backward", make_tensor_backward)
    patches.wrap(base_loader_iter(), "__next__", lambda orig: _timed_next(core, orig))


def _timed_next(core: Any, orig_next: Any) -> Any:
    def timed_next(it):
        ctx = core.ctx
        if not ctx.in_owner_process() or not core._here():
            return orig_next(it)
        if core.t_start is None:
            core.t_start = _perf()
        prev = ctx.phase
        ctx.phase = "data"
        t0 = _perf()
        try:
            return orig_next(it)
        finally:
            wait = _perf() - t0
            ctx.phase = prev if prev != "data" else "other"
            core.data_s += wait
            core.batches += 1
            if it not in core.loaders_seen:
                core._describe_loader(it)
            core._dispatch("on_batch", ctx, wait)

    return timed_next
