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
their CUDA event has completed (``numerics/hostread.py``): no device sync in the loop.
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

Events: ``numerics`` {steps, opt, loss, grad_norm} (every 32 rows); ``nonfinite`` {what, step,
...} once; ``nonfinite_contained`` once; ``grad_norm_overflow``; ``nan_monitor`` {forward_watch,
check_every, rows, reads, records, flushes, modified, flush_bytes, found, contained,
scaler_skips} at the end.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

from torchdoctor.instruments import Instrument, register
from torchdoctor.numerics.locate import Locator
from torchdoctor.numerics.locate import num as _num

FORCE_ROW_RECORDS = 50_000  # a window this long (eval loop without steps) is reduced early
FLUSH_AT = 512  # queued tensors reduced at once at the latest
# queued bytes reduced at once at the latest: the tensors held for the reduction raise the
# script's peak memory by about this much (those autograd does not keep anyway)
FLUSH_MIN_BYTES = 32 << 20
FLUSH_OF_ALLOCATED = 0.25  # at most this share of the CUDA memory allocated at backward start
FLUSH_OF_HEADROOM = 0.5  # and at most this share of the device memory not reserved then
INF = float("inf")
EMIT_EVERY = 32  # rows per ``numerics`` event
LEARN_CONTAINED = 3  # windows with contained -Inf (masks) inspected to learn benign modules
MAX_PENDING = 256  # CUDA rows not yet copied back before the oldest is waited for


class LossInfo(NamedTuple):
    """One tensor passed to ``backward`` in a window (formatted only when reported)."""

    shape: tuple
    dtype: Any
    scalar: bool
    after_records: int  # records of the window before it
    step: int

    def as_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": str(self.dtype).replace("torch.", ""),
                "scalar": self.scalar, "after_records": self.after_records, "step": self.step}


def _passthrough_types(torch: Any) -> frozenset:
    """Leaf module classes whose output is finite whenever their input is (see
    :meth:`NanMonitor._alias_passthrough`); exact classes, not subclasses."""
    nn = torch.nn
    names = ("ReLU", "ReLU6", "LeakyReLU", "Identity", "Flatten", "Unflatten", "Dropout",
             "Dropout1d", "Dropout2d", "Dropout3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
             "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d")
    return frozenset(getattr(nn, n) for n in names if hasattr(nn, n))


class _Window:
    """What one window recorded. ``recs[seq]`` = (role, module, cid, step, index, alias).

    Watched tensors wait in ``pend`` (per (dtype, device index): entries [tensor, version at
    record time, seq]) until :meth:`NanMonitor._flush` reduces them, then their per-record
    statistics sit in ``reduced`` (per (key, k): the 0-dim values, k per record, and the seqs)."""

    __slots__ = ("pend", "npend", "qbytes", "reduced", "modified", "last_entry", "inplace", "recs", "calls", "parents",
                 "grad_on", "losses", "loss_info", "stack", "last_out", "last_ver", "last_seq",
                 "order", "root_outs")

    def __init__(self) -> None:
        self.pend: dict[Any, list] = {}
        self.npend = 0
        self.qbytes = 0  # bytes of the queued tensors
        self.reduced: dict[Any, tuple[list, list]] = {}  # ((dtype, dev), k) -> (0-dim values, seqs)
        self.modified = 0  # records dropped: their tensor was modified in place before the flush
        self.last_entry: list | None = None  # pend entry of ``last_out`` (None once flushed)
        self.inplace: dict[int, int] = {}  # seq -> seq of the same tensor before an in-place op
        self.recs: list[tuple] = []
        self.calls: list[Any] = []  # cid -> module
        self.parents: list[int] = []  # cid -> parent cid (-1: root call)
        self.grad_on: list[bool] = []  # cid -> grad mode at the call
        self.losses: list[Any] = []  # detached: scalar losses as given, others [min, max] float32 (float64 kept)
        self.loss_info: list[LossInfo] = []
        self.stack: list[tuple[Any, int]] = []
        self.last_out = None
        self.last_ver = -1
        self.last_seq = -1
        self.order: dict[int, int] = {}  # id(module) -> seq of its last output
        self.root_outs: list[int] = []  # seqs of root modules' outputs

    def empty(self) -> bool:
        return not self.recs and not self.losses


class _Row:
    __slots__ = ("step", "opt", "row", "win", "params", "norms", "stacks", "loss_vec", "live",
                 "layout", "gnorm64", "neg_inf_before", "handle")

    def __init__(self, step, opt, row, win, params, norms, stacks, loss_vec, layout):
        self.step, self.opt, self.row, self.win = step, opt, row, win
        self.params, self.norms, self.stacks, self.loss_vec = params, norms, stacks, loss_vec
        self.layout = layout  # names of the row's entries
        self.live = True
        self.gnorm64: float | None = None  # float64 norm when the float32 one overflowed
        self.neg_inf_before: int | None = None  # an earlier -Inf-only record (a mask?)
        self.handle: Any = None  # CudaRowReader handle (None: a CPU row, read directly)


@register
class NanMonitor(Instrument):
    name = "nan_monitor"
    produces = frozenset({"nonfinite", "numerics", "grad_norm_overflow", "nan_monitor",
                          "nonfinite_contained"})
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
        self._grad_mode = (torch.is_grad_enabled, torch._C._set_grad_enabled)
        self._passthrough = _passthrough_types(torch)
        self._float_tensors = float_tensors
        self._as_real = as_real
        self._grad_norms = grad_norms
        self._wide = (torch.float32, torch.float64)  # dtypes a row keeps as they are
        self._aminmax = torch.aminmax
        self.fused = hasattr(torch, "_foreach_norm")
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
        self._undo: list = []
        self.scaler_skips = 0
        self._patch_scaler(torch)
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

        step.__wrapped__ = orig
        GS.step = step
        self._undo.append(lambda: setattr(GS, "step", orig))

    def uninstall(self, ctx: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        for u in reversed(self._undo):
            u()
        self._undo = []
        if not self.win.empty():
            self._close_row(None, [], step=ctx.step + 1)
        self._read()
        self._emit_series()
        ctx.emit("nan_monitor", forward_watch=self.watch, check_every=self.every, rows=self.rows,
                 reads=self.reads, records=self.records, flushes=self.flushes, modified=self.modified,
                 flush_bytes=self.flush_bytes, found=self.found,
                 contained=self.contained, scaler_skips=self.scaler_skips)

    # ------------------------------------------------------------------ forward watch
    def _owner(self) -> bool:
        return self.ctx.in_owner_thread()  # not forked workers, not other threads

    def _fwd_pre(self, module, args):
        try:
            if self.found or not self._owner() or self._compiling():
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
            if self.found or not self._owner() or self._compiling():
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

    @staticmethod
    def _defer(ts, role, module, cid, w, step) -> None:
        """Record each tensor; queue it for the window's next :meth:`_flush` (no device work)."""
        for i, t in enumerate(ts):
            seq = len(w.recs)
            try:
                ver = t._version
            except RuntimeError:  # inference tensors have no version counter
                ver = None
            if t is w.last_out:
                if ver == w.last_ver:
                    # the tensor recorded just before, unmodified since: an alias, nothing queued
                    w.recs.append((role, module, cid, step, i, w.last_seq))
                    continue
                if w.last_entry is not None and w.last_entry[0] is t:
                    w.inplace[seq] = w.last_seq  # modified in place by the caller in between
            key = (t.dtype, t.get_device())  # device index (-1: CPU): no device object made
            lst = w.pend.get(key)
            if lst is None:
                lst = w.pend[key] = []
            entry = [t, ver, seq]
            lst.append(entry)
            w.npend += 1
            w.qbytes += t.nbytes
            w.recs.append((role, module, cid, step, i, -1))
            w.last_out = t if ver is not None else None
            w.last_ver = ver
            w.last_seq = seq
            w.last_entry = entry

    def _flush(self, w: _Window) -> None:
        """Reduce the window's queued tensors on their device, one fused call per (dtype,
        device) on CUDA: per record, ``max |x|`` (``torch._foreach_norm(ord=inf)``: NaN
        propagates, an Inf is the max). Elsewhere ``torch.aminmax`` per tensor (the CPU's
        inf-norm is 10x slower), giving [min, max]. Both are exact for finiteness.

        A tensor whose version moved since it was recorded was modified in place (the caller's
        ``out += identity``): its record is dropped (the values it had are gone); the next
        module that receives it checks it as an input. Queued tensors are released here."""
        if not w.npend:
            return
        self.flushes += 1
        torch = self.torch
        grad_on, set_grad = self._grad_mode
        was_on = grad_on()
        if was_on:
            set_grad(False)  # nothing recorded for autograd
        try:
            for key, lst in w.pend.items():
                ts, seqs = [], []
                for t, ver, seq in lst:
                    if ver is not None and t._version != ver:
                        w.modified += 1
                        continue
                    ts.append(t)
                    seqs.append(seq)
                if not ts:
                    continue
                vals = None
                if self.fused and (ts[0].is_cuda or self.fused_cpu):
                    try:
                        vals = torch._foreach_norm(ts, INF)  # 0-dim max |x| per tensor
                        k = 1
                    except (RuntimeError, NotImplementedError, TypeError):
                        self.fused = False  # an older torch, a tensor subclass: per tensor
                if vals is None:
                    vals = []
                    if key[0].is_complex:  # [min, max] over the real and imaginary parts
                        ts = [self._as_real(t) for t in ts]
                    for t in ts:
                        vals.extend(self._aminmax(t))
                    k = 2
                got = w.reduced.get((key, k))
                if got is None:
                    w.reduced[(key, k)] = (list(vals), seqs)
                else:
                    got[0].extend(vals)
                    got[1].extend(seqs)
        finally:
            if was_on:
                set_grad(True)
            # released even when the reduction failed (e.g. out of memory): never hold them
            w.pend = {}
            w.npend = 0
            w.qbytes = 0
            w.last_entry = None

    # ------------------------------------------------------------------ loss
    def on_backward_begin(self, ctx: Any) -> None:
        if self.found:
            return
        w = self.win
        self._flush(w)  # before backward frees the activations (returns at once if empty)
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
            w.losses.append(t.detach())
            w.loss_info.append(LossInfo(t.shape, t.dtype, True, len(w.recs), ctx.step + 1))
            return
        ts = self._float_tensors(t, limit=4)
        if not ts:
            return
        torch = self.torch
        for t in ts:
            d = self._as_real(t.detach())  # detached: not recorded for autograd; complex: real
            scalar = d.numel() == 1
            w.losses.append(d if scalar else self._keep(torch.stack(torch.aminmax(d))))
            w.loss_info.append(LossInfo(t.shape, t.dtype, scalar, len(w.recs), ctx.step + 1))

    def _budget(self, dev: int) -> int:
        """Bytes the forward watch may queue before reducing (``flush_bytes``), set when
        backward begins, when the step holds about its most: a quarter of the CUDA memory
        allocated, at most half of the device memory not reserved by PyTorch's allocator (a
        script near its memory limit gets small batches, not an out-of-memory), at least
        32 MiB. Fewer, larger batches cost less host time (one fused call per batch)."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return FLUSH_MIN_BYTES
        if self.total_mem is None:
            self.total_mem = cuda.get_device_properties(dev).total_memory
        headroom = max(0, self.total_mem - cuda.memory_reserved(dev))
        want = min(cuda.memory_allocated(dev) * FLUSH_OF_ALLOCATED, headroom * FLUSH_OF_HEADROOM)
        return max(FLUSH_MIN_BYTES, int(want))

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

    def _close_row(self, opt: int | None, params: list, step: int) -> None:
        """Reduce the current window on the device into a short row; start a new window.

        The row holds, as present: ``fwd`` (0, or NaN when any watched tensor was non-finite:
        ``(stacked per-record statistics * 0).sum()``), ``lossflag`` (same for the losses), ``loss`` (the last
        scalar loss) and ``gnorm`` (global L2 norm of the gradients: NaN/Inf when one is).

        A row whose parts are all on the CPU is read at once into Python floats (a CPU read
        costs no sync; the global norm is then summed in float64, so it cannot overflow); a
        CUDA row stays a device tensor until :meth:`_read`.
        """
        torch = self.torch
        w = self.win
        self.win = _Window()
        self._flush(w)
        self.records += len(w.recs)
        self.modified += w.modified
        strided = torch.strided
        gp = []
        grads = []
        for p in params:
            g = p.grad
            if g is not None and g.layout == strided:
                gp.append(p)
                grads.append(g)
        norms = loss_vec = None
        parts: list = []
        layout: list[str] = []
        stacks = {}
        grad_on, set_grad = self._grad_mode
        was_on = grad_on()
        if was_on:
            set_grad(False)  # nothing recorded for autograd (cheaper than a no_grad block)
        try:
            if grads:
                ns = self._grad_norms(grads)  # float32, float64 for float64 gradients
                dev = ns[0].device
                if dev.type == "cpu" and not self.async_test:
                    norms = [n.item() for n in ns]  # per-parameter norms, read at once
                else:
                    try:
                        norms = torch.stack(ns)
                    except RuntimeError:  # gradients on several devices
                        norms = torch.stack([n.to(dev) for n in ns])
            flags = []
            for (key, k), (vals, seqs) in w.reduced.items():
                st = torch.stack(vals).view(-1, k)  # one row of k statistics per record
                stacks[key, k] = (st, seqs)
                flags.append(st.mul(0).sum(dtype=torch.float32))
            if flags:
                dev0 = flags[0].device
                parts.append(flags[0] if len(flags) == 1 else
                             torch.stack([f.to(dev0) for f in flags]).sum())
                layout.append("fwd")
            if len(w.losses) == 1 and w.loss_info[0].scalar:
                loss_vec = w.losses[0]  # one scalar loss: its value is its own flag
                if loss_vec.dim():
                    loss_vec = loss_vec.reshape(())
                loss_vec = self._keep(loss_vec)
                parts.append(loss_vec)
                layout.append("loss")
            elif w.losses:
                dev0 = w.losses[0].device
                loss_vec = torch.cat([self._keep(v.reshape(-1)).to(dev0) for v in w.losses])
                parts.append(loss_vec.mul(0).sum())
                layout.append("lossflag")
                last = self._last_scalar(w)
                if last is not None:
                    parts.append(loss_vec[last])
                    layout.append("loss")
            if norms is not None:
                layout.append("gnorm")
            if not layout:
                return
            on_cpu = all(not x.is_cuda for x in parts) and (norms is None or isinstance(norms, list))
            if on_cpu and not self.async_test:
                row: Any = [float(x) for x in parts]
                if norms is not None:
                    row.append(math.hypot(*norms))  # float64, exact to an ulp
            else:
                if isinstance(norms, list):  # CPU gradients, a CUDA loss
                    parts.append(torch.tensor(math.hypot(*norms), device="cpu"))
                elif norms is not None:
                    parts.append(torch.linalg.vector_norm(norms))
                dev = parts[-1].device
                row = torch.stack([x if x.device == dev else x.to(dev) for x in parts])
        finally:
            if was_on:
                set_grad(True)
        for r in self.pending:
            r.live = False  # gradients / tensors of older rows may have changed since
        new = _Row(step, opt, row, w, gp, norms, stacks, loss_vec, layout)
        if not isinstance(row, list) and not self.sync_read and (row.is_cuda or self.async_test):
            if self.reader is None:
                from torchdoctor.numerics import hostread

                self.reader = (hostread.DeferredRowReader() if self.async_test
                               else hostread.CudaRowReader())
            new.handle = self.reader.submit(row)
        self.pending.append(new)
        self.rows += 1

    def _maybe_read(self) -> None:
        """CPU rows: read every ``check_every`` rows (a CPU read costs no sync). CUDA rows:
        read those whose copy has landed (no sync); wait only when too many are in flight."""
        if not self.pending:
            return
        if self.pending[-1].handle is None:
            if len(self.pending) >= self.every:
                self._read()
        else:
            self._read(block=len(self.pending) > MAX_PENDING)

    def _keep(self, v: Any) -> Any:
        """``v`` in float32, or float64 when it is float64: a finite float64 loss above
        float32's range must not read back as Inf."""
        return v if v.dtype in self._wide else v.float()

    @staticmethod
    def _last_scalar(w: _Window) -> int | None:
        """Index of the last scalar loss in the concatenated loss vector."""
        pos = 0
        last = None
        for info in w.loss_info:
            if info.scalar:
                last = pos
            pos += 1 if info.scalar else 2
        return last

    def _read(self, block: bool = True) -> None:
        """Read pending rows in order (all of them, or with ``block=False`` only those already on
        the host); localize the first non-finite one."""
        if not self.pending:
            return
        torch = self.torch
        rows: list[_Row] = []
        while self.pending:
            r = self.pending[0]
            if not block and r.handle is not None and not self.reader.ready(r.handle):
                break
            rows.append(self.pending.pop(0))
        if not rows:
            return
        self.reads += 1
        flat: list[float] = []
        cpu = [r.row for r in rows if r.handle is None and not isinstance(r.row, list)]
        cpu_vals = torch.cat([x.to(cpu[-1].device) for x in cpu]).tolist() if cpu else []
        for r in rows:
            if isinstance(r.row, list):  # a CPU row, read when it was made
                flat += r.row
            elif r.handle is None:
                n = len(r.layout)
                flat += cpu_vals[:n]
                cpu_vals = cpu_vals[n:]
            else:
                flat += self.reader.values(r.handle)
        steps, opts, losses, norms = [], [], [], []
        pos = 0
        for r in rows:
            vals = dict(zip(r.layout, flat[pos:pos + len(r.layout)]))
            pos += len(r.layout)
            steps.append(r.step)
            opts.append(r.opt)
            losses.append(_num(vals["loss"]) if "loss" in vals else None)
            norms.append(_num(vals["gnorm"]) if "gnorm" in vals else None)
            fwd_ok = math.isfinite(vals.get("fwd", 0.0))
            loss_ok = math.isfinite(vals.get("lossflag", vals.get("loss", 0.0)))
            grads_ok = math.isfinite(vals.get("gnorm", 0.0))
            if self.found or (fwd_ok and loss_ok and grads_ok):
                continue
            if not fwd_ok and loss_ok and grads_ok and ("loss" in vals or "lossflag" in vals
                                                        or "gnorm" in vals):
                # non-finite values inside the forward that never reached the loss or the
                # gradients (masks filled with -inf, values a torch.where discards): by design
                self.contained += 1
                if self.contained <= LEARN_CONTAINED:
                    self._learn_benign(r)
                continue
            try:
                self._localize(r, fwd_ok, loss_ok, grads_ok)
            finally:
                r.win = None
            if r.gnorm64 is not None:
                norms[-1] = r.gnorm64
        se = self.series
        for lst, new in zip(se, (steps, opts, losses, norms)):
            lst.extend(new)
        if len(se[0]) >= EMIT_EVERY or self.found:
            self._emit_series()

    def _emit_series(self) -> None:
        se = self.series
        if se[0]:
            self.ctx.emit("numerics", steps=se[0], opt=se[1], loss=se[2], grad_norm=se[3])
        self.series = ([], [], [], [])

    # ------------------------------------------------------------------ localization
    def _localize(self, r: _Row, fwd_ok: bool, loss_ok: bool, grads_ok: bool) -> None:
        from torchdoctor.numerics.names import Namer

        ctx = self.ctx
        namer = Namer(ctx.models())
        w = r.win
        ev: dict[str, Any] | None = None
        if not fwd_ok:
            ev = self.locator.forward(r, namer)
        if ev is None and not loss_ok:
            ev = self.locator.loss(r, namer)
        if ev is None and not grads_ok:
            ev = self.locator.grads(r, namer)
        if ev is None:
            return
        ev.setdefault("step", r.step)
        ev["forward_watch"] = self.watch
        ev["optimizer"] = r.opt
        if w is not None:
            ev["losses"] = [i.as_dict() for i in w.loss_info[:4]]
        self.found = True
        ctx.emit("nonfinite", **ev)
        if self.stop_on_bad:
            ctx.request_stop(f"first non-finite value found at step {ev['step']}")

    def _learn_benign(self, r: _Row) -> None:
        """Modules whose -Inf outputs never reached the loss (masks) are benign later on."""
        w = r.win
        if w is None:
            return
        for seq, weak in self.locator.bad_records(r):
            rec = w.recs[seq]
            if weak and rec[0] == "out":
                self.benign.add(id(rec[1]))
        if self.contained == 1:
            from torchdoctor.numerics.names import Namer

            namer = Namer(self.ctx.models())
            self.ctx.emit("nonfinite_contained", step=r.step,
                          modules=[namer.module(m) for m in {id(x): x for x in w.calls}.values()
                                   if id(m) in self.benign][:8])
