"""The harness core: the patches that see the training loop, the step clock and the dispatch.

Installed once in the child, before the user's script runs. It owns:

* step boundaries: the global optimizer step post hook (fallback: the end of each outermost
  ``backward`` when the script never builds a ``torch.optim.Optimizer``);
* the phase of the loop (``ctx.phase``) and the wall time split per step into data wait
  (``_BaseDataLoaderIter.__next__``), forward (root module forward, via per-root hooks after
  a two-step discovery with global hooks), backward (``torch.autograd.backward`` /
  ``Tensor.backward`` wrapper), optimizer (step pre → post hook) and other;
* on CUDA (only once the script itself initialised CUDA), device time per phase from CUDA
  events recorded at the phase boundaries and read a step later with ``Event.query()``:
  never a synchronisation inside the loop;
* calling each armed instrument's callbacks; a callback that raises is disabled and
  reported (``instrument_error`` event), never propagated into the user's code;
* ``--steps N`` / ``ctx.request_stop``: :class:`StopRun` raised from the post hook of the
  step that completes the run, i.e. exactly at a step boundary.

Events written (one line each, at most two per step):
``step`` {step, wall_s, data_s, forward_s, backward_s, optimizer_s, other_s, batches,
backwards, source}; ``step_device`` {step, forward_ms, backward_ms, optimizer_ms, span_ms,
busy}; ``dataloader`` once per iterator; ``models`` when roots are discovered.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import weakref
from typing import Any

from torchdoctor.runner.context import HarnessContext, StopRun

_perf = time.perf_counter
DISCOVERY_STEPS = 2  # global forward hooks find the root modules during the first steps


def user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """The nearest caller frame outside torch/torchdoctor/stdlib, as (file, line, function)."""
    from torchdoctor.runner.frames import is_user_file

    f = sys._getframe(depth)
    while f is not None:
        co = f.f_code
        if is_user_file(co.co_filename):
            return (co.co_filename, f.f_lineno, co.co_name)
        f = f.f_back
    return None


class Core:
    """Patches + step clock + instrument dispatch. ``install()`` then ``uninstall()`` once."""

    def __init__(self, ctx: HarnessContext, instruments: list[Any]):
        self.ctx = ctx
        self.instruments = instruments
        steps = ctx.options.get("steps")
        self.max_steps = int(steps) if steps else 0
        self._undo: list[Any] = []
        self._errors: set[str] = set()
        # callbacks of instruments that override them, in priority order
        self.cb = {name: [(i.name, getattr(i, name)) for i in instruments if i.overrides(name)]
                   for name in ("on_step_end", "on_backward_begin", "on_backward_end", "on_batch",
                                "on_crash")}
        # clock state
        self.n_optimizers_built = 0
        self.source = None  # "optimizer" | "backward"
        self.closing_opt: int | None = None  # id of the optimizer whose step ends an iteration
        self.opt_since_boundary: list[int] = []
        self.t_start: float | None = None  # start of the current step (first activity)
        self.data_s = self.fwd_s = self.bwd_s = self.opt_s = 0.0
        self.batches = self.backwards = 0
        self.t_phase = 0.0
        self.fwd_depth = 0
        self.bwd_depth = 0
        self.roots_hooked: set[int] = set()
        self.global_fwd_handles: list[Any] = []
        self.loaders_seen: Any = weakref.WeakSet()  # iterators described (nothing set on them)
        self.cuda = None  # CudaPhaseTimer once CUDA is in use

    # ------------------------------------------------------------------ install / uninstall
    def install(self) -> None:
        import torch
        from torch.optim import optimizer as optim_mod
        from torch.utils.data import dataloader as dl_mod

        self._torch = torch
        from torchdoctor.runner.userhooks import install_state_filter

        # hooks on the user's modules never travel into a deepcopy or a pickle of them
        self._undo.append(install_state_filter())
        h1 = optim_mod.register_optimizer_step_pre_hook(self._opt_pre)
        h2 = optim_mod.register_optimizer_step_post_hook(self._opt_post)
        self._undo += [h1.remove, h2.remove]

        orig_init = optim_mod.Optimizer.__init__
        core = self

        def opt_init(opt, *a, **k):
            orig_init(opt, *a, **k)
            if core.ctx.in_owner_process():
                core.n_optimizers_built += 1

        optim_mod.Optimizer.__init__ = opt_init
        self._undo.append(lambda: setattr(optim_mod.Optimizer, "__init__", orig_init))

        # backward: torch.autograd.backward and Tensor.backward (the latter calls the former)
        orig_ab = torch.autograd.backward
        orig_tb = torch.Tensor.backward

        def autograd_backward(*a, **k):
            if core.bwd_depth == 0:  # the tensor being backpropagated (nan/training instruments)
                core.ctx.last_backward_tensor = a[0] if a else k.get("tensors")
            core._bwd_begin()
            try:
                return orig_ab(*a, **k)
            finally:
                core._bwd_end()

        def tensor_backward(self_t, *a, **k):
            if core.bwd_depth == 0:
                core.ctx.last_backward_tensor = self_t
            core._bwd_begin()
            try:
                return orig_tb(self_t, *a, **k)
            finally:
                core._bwd_end()

        autograd_backward.__wrapped__ = orig_ab
        tensor_backward.__wrapped__ = orig_tb
        torch.autograd.backward = autograd_backward
        torch.Tensor.backward = tensor_backward
        self._undo.append(lambda: setattr(torch.autograd, "backward", orig_ab))
        self._undo.append(lambda: setattr(torch.Tensor, "backward", orig_tb))

        # data wait: every DataLoader iterator inherits _BaseDataLoaderIter.__next__
        base = dl_mod._BaseDataLoaderIter
        orig_next = base.__next__

        def timed_next(it):
            ctx = core.ctx
            if not ctx.in_owner_process():
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
                for name, fn in core.cb["on_batch"]:
                    try:
                        fn(ctx, wait)
                    except Exception:  # noqa: BLE001
                        core._instrument_failed(name, "on_batch")

        timed_next.__wrapped__ = orig_next
        base.__next__ = timed_next
        self._undo.append(lambda: setattr(base, "__next__", orig_next))

        # forward: discover root modules with global hooks, then hook only the roots
        from torch.nn.modules import module as mod_mod

        self.global_fwd_handles = [
            mod_mod.register_module_forward_pre_hook(self._g_fwd_pre),
            mod_mod.register_module_forward_hook(self._g_fwd_post, always_call=True),
        ]
        self._undo.append(self._remove_global_fwd)

        for inst in self.instruments:
            self._safe(inst.name, "install", inst.install, self.ctx)

    def uninstall(self) -> None:
        for inst in reversed(self.instruments):
            self._safe(inst.name, "uninstall", inst.uninstall, self.ctx)
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # noqa: BLE001
                pass
        self._undo.clear()
        if self.cuda is not None:
            try:
                self.cuda.flush(final=True)
            except Exception:  # noqa: BLE001
                self._instrument_failed("stepclock", "cuda-events")

    def crash(self, exc: BaseException) -> None:
        for name, fn in self.cb["on_crash"]:
            try:
                fn(self.ctx, exc)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_crash")

    # ------------------------------------------------------------------ failures
    def _safe(self, name: str, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            self._instrument_failed(name, what)

    def _instrument_failed(self, name: str, callback: str) -> None:
        key = f"{name}.{callback}"
        if key in self._errors:
            return
        self._errors.add(key)
        self.ctx.emit("instrument_error", instrument=name, callback=callback,
                      traceback=traceback.format_exc(limit=8))
        for cb_name, lst in self.cb.items():
            if cb_name == callback:
                self.cb[cb_name] = [(n, f) for n, f in lst if n != name]

    # ------------------------------------------------------------------ forward (roots)
    def _remove_global_fwd(self) -> None:
        for h in self.global_fwd_handles:
            h.remove()
        self.global_fwd_handles = []

    def _g_fwd_pre(self, module, args):
        if self.fwd_depth == 0:
            if os.getpid() != self.ctx._owner_pid or self.bwd_depth:
                return None
            self._root_begin()
            if self.ctx._add_model(module):
                self.ctx.emit("model", cls=type(module).__name__, step=self.ctx.step,
                              params=sum(p.numel() for p in module.parameters()))
        self.fwd_depth += 1
        return None

    def _g_fwd_post(self, module, args, output):
        if self.fwd_depth > 0:
            self.fwd_depth -= 1
            if self.fwd_depth == 0:
                self._root_end()
        return None

    def _root_pre(self, module, args):
        if self.fwd_depth == 0 and not self.bwd_depth and os.getpid() == self.ctx._owner_pid:
            self._root_begin()
        self.fwd_depth += 1
        return None

    def _root_post(self, module, args, output):
        if self.fwd_depth > 0:
            self.fwd_depth -= 1
            if self.fwd_depth == 0:
                self._root_end()
        return None

    def _switch_to_root_hooks(self) -> None:
        """After discovery: drop the global hooks (they slow every module call) for per-root ones.

        Only when every root's copies and pickles leave the hooks out (:func:`hookable`): a
        root whose class has its own ``__getstate__`` (``nn.LSTM``) keeps the global hooks on,
        so that nothing of torchdoctor's travels into the user's ``deepcopy`` or saved file."""
        from torchdoctor.runner.userhooks import hookable, register_on

        roots = self.ctx.models()
        try:
            if not all(hookable(m) for m in roots):
                return
        except Exception:  # noqa: BLE001
            self._instrument_failed("stepclock", "root-hooks")
            return
        self._remove_global_fwd()
        self.fwd_depth = 0
        for m in roots:
            if id(m) in self.roots_hooked:
                continue
            self.roots_hooked.add(id(m))
            try:  # UserHooks: a deepcopy or pickle of the model leaves them out
                h1, k1 = register_on(m, "forward_pre", self._root_pre)
                self._undo += [h1.remove, k1.detach]
                h2, k2 = register_on(m, "forward", self._root_post, always_call=True)
                self._undo += [h2.remove, k2.detach]
            except Exception:  # noqa: BLE001
                self._instrument_failed("stepclock", "root-hooks")

    def _root_begin(self) -> None:
        now = _perf()
        if self.t_start is None:
            self.t_start = now
        self.ctx.phase = "forward"
        self.t_phase = now
        if self.cuda is not None:
            self.cuda.mark("forward", 0)

    def _root_end(self) -> None:
        if self.ctx.phase == "forward":
            self.fwd_s += _perf() - self.t_phase
            self.ctx.phase = "other"
            if self.cuda is not None:
                self.cuda.mark("forward", 1)

    # ------------------------------------------------------------------ backward
    def _bwd_begin(self) -> None:
        self.bwd_depth += 1
        if self.bwd_depth != 1 or os.getpid() != self.ctx._owner_pid:
            return
        now = _perf()
        if self.t_start is None:
            self.t_start = now
        if self.ctx.phase == "forward":  # forward hook missed (functional model, exception)
            self.fwd_s += now - self.t_phase
        self.fwd_depth = 0
        self.ctx.phase = "backward"
        self.t_phase = now
        if self.cuda is None:
            self._maybe_cuda()
        if self.cuda is not None:
            self.cuda.mark("backward", 0)
        for name, fn in self.cb["on_backward_begin"]:
            try:
                fn(self.ctx)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_backward_begin")

    def _bwd_end(self) -> None:
        self.bwd_depth -= 1
        if self.bwd_depth != 0 or os.getpid() != self.ctx._owner_pid:
            return
        self.bwd_s += _perf() - self.t_phase
        self.backwards += 1
        self.ctx.phase = "other"
        if self.cuda is not None:
            self.cuda.mark("backward", 1)
        for name, fn in self.cb["on_backward_end"]:
            try:
                fn(self.ctx)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_backward_end")
        if self.n_optimizers_built == 0 and self.source != "optimizer":
            self.source = "backward"
            self._boundary()

    # ------------------------------------------------------------------ optimizer
    def _opt_pre(self, opt, args, kwargs):
        if os.getpid() != self.ctx._owner_pid:
            return None
        now = _perf()
        if self.t_start is None:
            self.t_start = now
        self.ctx.phase = "optimizer"
        self.t_phase = now
        if self.cuda is not None:
            self.cuda.mark("optimizer", 0)
        return None

    def _opt_post(self, opt, args, kwargs):
        if os.getpid() != self.ctx._owner_pid:
            return None
        self.opt_s += _perf() - self.t_phase
        self.ctx.phase = "other"
        if self.cuda is not None:
            self.cuda.mark("optimizer", 1)
        self.ctx._add_optimizer(opt)
        self.source = "optimizer"
        oid = id(opt)
        if self.closing_opt is None:
            self.closing_opt = oid
        elif oid != self.closing_opt and oid not in self.opt_since_boundary:
            # a second optimizer steps after the closing one (GAN-style): it closes from now on
            if not self.opt_since_boundary:
                self.closing_opt = oid
        self.opt_since_boundary.append(oid)
        if oid == self.closing_opt:
            self._boundary()
        return None

    # ------------------------------------------------------------------ step boundary
    def _boundary(self) -> None:
        ctx = self.ctx
        now = _perf()
        start = self.t_start if self.t_start is not None else now
        wall = now - start
        ctx.step += 1
        step = ctx.step
        busy = self.data_s + self.fwd_s + self.bwd_s + self.opt_s
        ctx.emit("step", step=step, wall_s=round(wall, 7), data_s=round(self.data_s, 7),
                 forward_s=round(self.fwd_s, 7), backward_s=round(self.bwd_s, 7),
                 optimizer_s=round(self.opt_s, 7), other_s=round(max(0.0, wall - busy), 7),
                 batches=self.batches, backwards=self.backwards, source=self.source)
        if self.cuda is None:
            self._maybe_cuda()
        if self.cuda is not None:
            self.cuda.step_end(step, wall)
        self.data_s = self.fwd_s = self.bwd_s = self.opt_s = 0.0
        self.batches = self.backwards = 0
        self.opt_since_boundary = []
        if step == 1:
            from torchdoctor.runner.harness import emit_device

            self._safe("stepclock", "device", emit_device, ctx)
        if step == DISCOVERY_STEPS:
            self._switch_to_root_hooks()
        for name, fn in self.cb["on_step_end"]:
            try:
                fn(ctx, step)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_step_end")
        self.t_start = _perf()
        if self.max_steps and step >= self.max_steps:
            ctx.request_stop(f"--steps {self.max_steps} reached")
        if ctx.stop_reason is not None:
            raise StopRun(ctx.stop_reason)

    # ------------------------------------------------------------------ CUDA
    def _maybe_cuda(self) -> None:
        torch = self._torch
        try:
            if torch.cuda.is_initialized():
                from torchdoctor.runner.cudaclock import CudaPhaseTimer

                self.cuda = CudaPhaseTimer(self.ctx)
        except Exception:  # noqa: BLE001
            self._instrument_failed("stepclock", "cuda-init")
            self.cuda = None

    # ------------------------------------------------------------------ data loader facts
    def _describe_loader(self, it) -> None:
        try:
            try:
                self.loaders_seen.add(it)
            except TypeError:  # an iterator class with __slots__ and no weakref: described again
                pass
            ds = getattr(it, "_dataset", None)
            getitem = getattr(type(ds), "__getitem__", None)
            where = None
            code = getattr(getitem, "__code__", None)
            if code is not None:
                from torchdoctor.runner.frames import is_user_file

                if is_user_file(code.co_filename):  # a library dataset's own file says little
                    where = f"{code.co_filename}:{code.co_firstlineno}"
            loop = user_frame(3)
            self.ctx.emit(
                "dataloader",
                step=self.ctx.step,
                num_workers=getattr(it, "_num_workers", None),
                pin_memory=bool(getattr(it, "_pin_memory", False)),
                prefetch_factor=getattr(it, "_prefetch_factor", None),
                persistent_workers=bool(getattr(it, "_persistent_workers", False)),
                batch_size=getattr(getattr(it, "_index_sampler", None), "batch_size", None),
                dataset=type(ds).__name__ if ds is not None else None,
                getitem=where,
                loop=f"{loop[0]}:{loop[1]}" if loop else None,
                iterator=type(it).__name__,
            )
        except Exception:  # noqa: BLE001
            self._instrument_failed("stepclock", "dataloader")
