"""The non-finite monitor: the first NaN/Inf of a run, located without anomaly mode's cost.

What is watched, per *window* (everything since the previous optimizer step):

* every module's forward inputs and outputs (``nan`` probe only, or option ``forward_watch``):
  global forward pre/post hooks queue each floating tensor (a reference and its version
  counter; no device work inside the forward). An input that is the very tensor the previous
  module returned, unmodified (same object, same version), is not queued again. The queue is
  reduced on the device (:meth:`NanMonitor._flush`, no sync) when backward begins, when a new
  root module call starts, after a forward without grad, and whenever it holds
  ``flush_bytes`` (see :meth:`NanMonitor._budget`; those that autograd does not keep raise
  the step's peak memory by at most that much): on CUDA one fused ``torch._foreach_norm(ord=inf)`` per dtype gives each tensor's
  max |x|; on CPU ``torch.aminmax`` per tensor. A tensor modified in place between its record
  and the reduction loses its record (the next module checks it as an input);
* the loss: the tensor passed to the outermost ``backward`` (``ctx.last_backward_tensor``);
* the gradients of the optimizer about to step (a global optimizer *pre*-step hook, so the
  gradients are exactly those the update will use): one fused ``torch._foreach_norm``.

At the optimizer pre-step the window is reduced on the device to a short row (forward flag
``(per-record values * 0).sum()``: NaN iff one is non-finite; the loss; the global grad norm).
CPU rows are read with one ``.tolist()`` every ``check_every`` steps (1 for ``nan``, 8 for
``checkup``); CUDA rows are copied to pinned memory with ``non_blocking=True`` and read once
their CUDA event has completed (``numerics/hostread.py``): no device sync in the loop. With
several ranks that moment would differ per rank (one stops, its peers enter the next step's
collectives alone: a hang), so there row N is read at row N+1's close on every rank, waiting
for its copy if need be (``_nan_rows.RowReader._maybe_read``).
Both reductions are exact for finiteness (NaN propagates, an Inf is the min, max or max |x|;
``bench/reduce_kernels.py`` checks it per dtype), unlike a sum, which can overflow to Inf on
finite values.

When a row is not finite, the window's records say where it started, in execution order:
the first non-finite *output* of a module whose inputs were finite names that module; a
first non-finite *input* names the code that called the module (its parent's own forward),
or the data when the module is a root; else the loss; else the gradients (the parameter
whose module ran last in forward, i.e. first in backward). That is written as one
``nonfinite`` event; the ``nan`` probe then stops the run at the step's end. A window whose
forward held non-finite values that never reached the loss or the gradients (a -Inf
attention mask) is not reported; the modules that made those -Inf values are remembered, and
their Inf-only values are skipped when a later step does go bad (the NaN it caused is what
gets named).

``clip_grad_norm_`` is wrapped to keep the norm it returns (before clipping) and ``max_norm``
for the window's row: the series then shows what the gradients were, not the clipped 1.0.

Sharded parameters (FSDP2 ``fully_shard``, tensor parallelism: DTensor parameters, gradients
and module outputs): every tensor is read through its local shard
(``torch_internals.local_tensor``), so nothing here mixes a DTensor with a plain tensor or runs
a collective by reducing a DTensor. The row's gradient norm is the full gradients' norm, equal
to ``clip_grad_norm_`` on the full tensors: each mesh's shares summed by one all-reduce per mesh
dimension over that dimension's own group (``numerics/sharded.py``), at the optimizer pre-step
that every rank reaches in order. So every rank of the mesh sees a non-finite norm at the same
row; the rank whose own shard, forward or loss holds the value names it, a rank whose shards
are all finite records ``nonfinite_elsewhere`` and (``nan`` probe) stops at the same step.
Localisation reads local shards only: it runs on whichever rank found something, and a
collective there would hang.

Events: ``numerics`` {steps, opt, loss, grad_norm[, grad_norm_pre_clip, clip_max]} (every 32 rows); ``nonfinite`` {what, step,
...} once; ``nonfinite_contained`` once; ``nonfinite_elsewhere`` {step} once; ``grad_norm_overflow``;
``nan_monitor`` {forward_watch, check_every, rows, reads, records, flushes, modified,
flush_bytes, found, contained, scaler_skips, sharded_rows, partial_grads} at the end.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.instruments.nan._nan_rows import RowReader
from torchdoctor.instruments.nan._nan_window import (FLUSH_AT, FLUSH_MIN_BYTES, FORCE_ROW_RECORDS,
                                                 LossInfo, WindowQueue, _passthrough_types, _Row,
                                                 _Window)
from torchdoctor.runner.patching import Patches
from torchdoctor.torch_internals import foreach_norm, set_grad_enabled_raw
from torchdoctor.numerics.locate import Locator
from torchdoctor.numerics.tensors import kept_scalar

@register
class NanMonitor(WindowQueue, RowReader, Instrument):
    name = "nan_monitor"
    produces = frozenset({"nonfinite", "numerics", "grad_norm_overflow", "nan_monitor",
                          "nonfinite_contained", "nonfinite_elsewhere"})
    priority = 60

    # ------------------------------------------------------------------ install
    def install(self, ctx: Any) -> None:
        import torch
        from torch.nn.modules import module as mod_mod
        from torch.optim import optimizer as optim_mod

        self.torch = torch
        self.ctx = ctx
        from torchdoctor.numerics.tensors import _kit, as_real, float_tensors, grad_norms

        self._Tensor, self._ok = _kit()
        self._grad_mode = (torch.is_grad_enabled, set_grad_enabled_raw())
        self._passthrough = _passthrough_types(torch)
        self._float_tensors = float_tensors
        self._as_real = as_real
        self._grad_norms = grad_norms
        self._wide = (torch.float32, torch.float64)  # dtypes a row keeps as they are
        self._aminmax = torch.aminmax
        self._fused_norm = foreach_norm()
        self.fused = self._fused_norm is not None
        opts = ctx.options
        self.fused_cpu = bool(opts.get("nan_fused_cpu"))  # the CUDA reduction on CPU (tests)
        self.flush_bytes = FLUSH_MIN_BYTES
        self.budget_step = 0  # the step at which the queue's budget is next re-read
        self.total_mem: int | None = None
        self.flushes = 0
        fw = opts.get("forward_watch")
        self.watch = bool(ctx.probe == "nan" if fw is None else fw)
        every = opts.get("check_every")
        self.every = max(1, int(every if every else (1 if ctx.probe == "nan" else 8)))
        # read CUDA rows with a sync each step instead of asynchronously (for comparisons)
        self.sync_read = bool(opts.get("nan_sync_read"))
        self.async_test = bool(opts.get("nan_async_test"))  # CUDA read timing on CPU (tests)
        stop = opts.get("stop_on_nonfinite")
        self.stop_on_bad = bool(ctx.probe == "nan" if stop is None else stop)
        self.pid = os.getpid()
        self.win = _Window()
        self.pending: list[_Row] = []
        self.reader = None  # CudaRowReader, made on the first CUDA row
        self.series: tuple[list, list, list, list] = ([], [], [], [])
        self.clip_series: tuple[list, list] = ([], [])  # per row: norm before clipping, max_norm
        self.found = False
        self.contained = 0
        self.benign: set[int] = set()
        self.locator = Locator(torch, self.benign, ctx.emit)
        self.rows = 0
        self.reads = 0
        self.records = 0
        self.modified = 0
        self.pre_steps_this_step = 0
        self.pre_steps_total = 0
        self.opt_ids: dict[int, int] = {}
        self.handles = [optim_mod.register_optimizer_step_pre_hook(self._pre_step)]
        if self.watch:
            self.handles.append(mod_mod.register_module_forward_pre_hook(self._fwd_pre))
            self.handles.append(mod_mod.register_module_forward_hook(self._fwd_post, always_call=True))
        self._undo = Patches()  # undone only where our wrapper is still on top
        self.scaler_skips = 0
        self.sharded_rows = 0  # rows whose gradient norm was summed over DTensor meshes
        self.partial_grads = 0  # most Partial-placed gradients in a row (finiteness only)
        self._patch_scaler(torch)
        self._patch_clip(torch)
        try:
            self._compiling = torch.compiler.is_compiling
        except AttributeError:  # pragma: no cover - older torch
            self._compiling = lambda: False

    def _patch_scaler(self, torch) -> None:
        """A GradScaler skips ``optimizer.step()`` when the (float16) gradients overflow, which
        is expected; the forward and the loss of that iteration are still judged here."""
        from torch.amp import grad_scaler

        GS = grad_scaler.GradScaler
        orig = GS.step
        inst = self

        def step(gs, optimizer, *a, **k):
            before = inst.pre_steps_total
            try:
                return orig(gs, optimizer, *a, **k)
            finally:
                try:
                    if inst.pre_steps_total == before and inst._owner() and not inst.win.empty():
                        inst.scaler_skips += 1
                        inst._close_row(None, [], step=inst.ctx.step + 1)
                        inst._maybe_read()
                except Exception:  # noqa: BLE001 - never raise into the user's code
                    inst.hook_failed(inst.ctx, "GradScaler.step")

        self._undo.set(GS, "step", step, orig)

    def _patch_clip(self, torch) -> None:
        """``clip_grad_norm_`` returns the total norm *before* clipping; the row's own norm, read at
        the optimizer pre-step, is the clipped one (1.0 every step under ``max_norm=1``). The
        returned tensor (no copy, no sync) and ``max_norm`` are kept for the window's row."""
        from torch.nn.utils import clip_grad

        orig = clip_grad.clip_grad_norm_
        inst = self

        def clip_grad_norm_(parameters, max_norm, *a, **k):
            total = orig(parameters, max_norm, *a, **k)
            try:
                # a plain tensor only: a DTensor norm (FSDP2) would not stack with the row's tensors
                if inst._owner() and type(total) is torch.Tensor and total.numel() == 1 \
                        and total.device.type != "meta":
                    inst.win.clip = (total, float(max_norm))
            except Exception:  # noqa: BLE001 - never raise into the user's code
                inst.hook_failed(inst.ctx, "clip_grad_norm_")
            return total

        clip_grad_norm_.__doc__ = orig.__doc__
        self._undo.set(clip_grad, "clip_grad_norm_", clip_grad_norm_, orig)
        if getattr(torch.nn.utils, "clip_grad_norm_", None) is orig:
            self._undo.set(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_, orig)

    def uninstall(self, ctx: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self._undo.undo()
        if not self.win.empty():
            self._close_row(None, [], step=ctx.step + 1)
        self._read()
        self._emit_series()
        ctx.emit("nan_monitor", forward_watch=self.watch, check_every=self.every, rows=self.rows,
                 reads=self.reads, records=self.records, flushes=self.flushes, modified=self.modified,
                 flush_bytes=self.flush_bytes, found=self.found,
                 contained=self.contained, scaler_skips=self.scaler_skips,
                 sharded_rows=self.sharded_rows, partial_grads=self.partial_grads)

    # ------------------------------------------------------------------ forward watch
    def _owner(self) -> bool:
        return self.ctx.in_owner_thread()  # not forked workers, not other threads

    def _fwd_pre(self, module, args):
        try:
            if self._compiling() or self.found or not self._owner():
                return None
            w = self.win
            if w.npend and not w.stack:  # a new root call: the last one's tensors are reduced now
                self._flush(w)
            cid = len(w.calls)
            w.calls.append(module)
            w.parents.append(w.stack[-1][1] if w.stack else -1)
            w.grad_on.append(self.torch.is_grad_enabled())
            w.stack.append((module, cid))
            if args:
                a0 = args[0]
                if len(args) == 1 and type(a0) is self._Tensor:  # the common case, inlined
                    if self._ok(a0):
                        self._record((a0,), "in", module, cid)
                    return None
                ts = self._float_tensors(args)
                if ts:
                    self._record(ts, "in", module, cid)
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_fwd_pre")
        return None

    def _fwd_post(self, module, args, output):
        try:
            if self._compiling() or self.found or not self._owner():
                return None
            w = self.win
            cid = -1
            st = w.stack
            if st and st[-1][0] is module:
                cid = st.pop()[1]
            else:  # an exception unwound some calls, or the window was reset mid-forward
                for i in range(len(st) - 1, -1, -1):
                    if st[i][0] is module:
                        cid = st[i][1]
                        del st[i:]
                        break
            if output is None or cid < 0:
                return None
            if type(output) is self._Tensor:
                if (type(module) in self._passthrough and w.last_out is not None
                        and self._alias_passthrough(module, cid, args, output)):
                    return None
                ts = (output,) if self._ok(output) else ()
            else:
                ts = self._float_tensors(output)
            if ts:
                self._record(ts, "out", module, cid)
                if not st:
                    w.root_outs.append(len(w.recs) - 1)
            if not st and w.npend and not w.grad_on[cid]:
                self._flush(w)  # no backward follows a forward without grad: don't hold its tensors
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_fwd_post")
        return None

    def _alias_passthrough(self, module: Any, cid: int, args: tuple, output: Any) -> bool:
        """A leaf module that cannot make a non-finite value out of finite ones (ReLU, Identity,
        Flatten, max-pooling; Dropout except in float16 training, whose 1/(1-p) scaling can
        overflow float16): when its only input is the tensor checked just before, unmodified
        since, its output is recorded as an alias of that check instead of being reduced again.
        Its output is non-finite only if its input was, and that input's record comes first."""
        w = self.win
        if len(args) != 1 or args[0] is not w.last_out or not self._ok(output):
            return False
        if module.training and getattr(module, "p", 0) and output.dtype == self.torch.float16:
            return False
        a0 = args[0]
        try:
            unmodified = a0._version == w.last_ver or (a0 is output and getattr(module, "inplace", False))
            ver = output._version
        except RuntimeError:  # inference tensors have no version counter
            return False
        if not unmodified:
            return False
        if a0 is output and w.last_entry is not None and w.last_entry[0] is a0:
            # modified in place by a module that keeps NaN and +Inf (ReLU(inplace=True)): the
            # queued source stays valid at the new version
            w.last_entry[1] = ver
        seq = len(w.recs)
        w.recs.append(("out", module, cid, self.ctx.step, 0, w.last_seq))
        w.order[id(module)] = seq
        w.last_out = output
        w.last_ver = ver
        if not w.stack:
            w.root_outs.append(seq)
        return True

    def _record(self, ts: list, role: str, module: Any, cid: int) -> None:
        w = self.win
        self._defer(ts, role, module, cid, w, self.ctx.step)
        if role == "out":
            w.order[id(module)] = len(w.recs) - 1
        if w.qbytes >= self.flush_bytes or w.npend >= FLUSH_AT:
            self._flush(w)
        if len(w.recs) > FORCE_ROW_RECORDS:
            self._close_row(None, [], step=self.ctx.step + 1)
            self._maybe_read()

    def on_backward_begin(self, ctx: Any) -> None:
        if self.found:
            return
        w = self.win
        self._flush(w)  # before backward frees the activations (returns at once if empty)
        w.last_out = None  # the forward is over: autograd decides what of it lives on
        if ctx.step >= self.budget_step and w.reduced:
            # steps 0, 1, 2, 4, ... 64, then every 64: the allocator's statistics cost ~0.2 ms
            # a read, and a step's memory settles after the first few
            dev = next((key[1] for key, _k in w.reduced if key[1] >= 0), -1)
            if dev >= 0:
                self.budget_step = min(2 * ctx.step, ctx.step + 64) or 1
                self.flush_bytes = self._budget(dev)
        t = ctx.last_backward_tensor
        if (type(t) is self._Tensor and t.numel() == 1 and self._ok(t)
                and not t.is_complex()):  # a real scalar loss: inlined
            # kept until the window is read: a copy when the loss is a view of a larger storage
            w.losses.append(kept_scalar(t))
            w.loss_info.append(LossInfo(t.shape, t.dtype, True, len(w.recs), ctx.step + 1))
            return
        ts = self._float_tensors(t, limit=4)
        if not ts:
            return
        torch = self.torch
        for t in ts:
            d = self._as_real(t.detach())  # detached: not recorded for autograd; complex: real
            scalar = d.numel() == 1
            w.losses.append(kept_scalar(d) if scalar else self._keep(torch.stack(torch.aminmax(d))))
            w.loss_info.append(LossInfo(t.shape, t.dtype, scalar, len(w.recs), ctx.step + 1))

    # ------------------------------------------------------------------ gradients / rows
    def _pre_step(self, opt, args, kwargs):
        try:
            if not self._owner():
                return None
            self.pre_steps_this_step += 1
            self.pre_steps_total += 1
            oid = self.opt_ids.setdefault(id(opt), len(self.opt_ids))
            params = [p for g in opt.param_groups for p in g["params"]]
            self._close_row(oid, params, step=self.ctx.step + 1)
            self._maybe_read()
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_pre_step")
        return None

    def on_step_end(self, ctx: Any, step: int) -> None:
        # the step clock counts backward calls when no optimizer exists: gradients of the
        # models' parameters are read here instead of at an optimizer pre-step
        if self.pre_steps_this_step == 0 and not self.win.empty():
            params = [p for m in ctx.models() for p in m.parameters()]
            self._close_row(None, params, step=step)
            self._maybe_read()
        self.pre_steps_this_step = 0

    def on_crash(self, ctx: Any, exc: BaseException) -> None:
        if not self.win.empty():
            self._close_row(None, [], step=ctx.step + 1)
        self._read()
