"""The step clock (part of :class:`torchdoctor.runner.core.Core`): step boundaries, the phase
of the loop and the time split of each step.

* step boundaries: the global optimizer step post hook (:mod:`torchdoctor.runner.cycle`;
  fallback: the end of each outermost ``backward`` when the script never builds a
  ``torch.optim.Optimizer``);
* the phase of the loop (``ctx.phase``) and the wall time split per step into data wait
  (the DataLoader iterators' ``__next__``), forward (root module forward, via per-root hooks
  after a two-step discovery with global hooks), backward (``torch.autograd.backward`` /
  ``Tensor.backward`` wrapper), optimizer (step pre -> post hook) and other;
* on CUDA (only once the script itself initialised CUDA), device time per phase from CUDA
  events recorded at the phase boundaries and read a step later with ``Event.query()``:
  never a synchronisation inside the loop (:mod:`torchdoctor.runner.cudaclock`);
* ``--steps N`` / ``ctx.request_stop``: :class:`StopRun` raised from the post hook of the
  step that completes the run, i.e. exactly at a step boundary, in the main thread only.

Events written (one line each, at most two per step): ``step`` {step, wall_s, data_s,
forward_s, backward_s, optimizer_s, other_s, batches, backwards, source}; ``step_device``
{step, forward_ms, backward_ms, optimizer_ms, span_ms, busy}; ``models`` when roots are
discovered.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from torchdoctor.runner.context import StopRun
from torchdoctor.runner.device import emit_device

_perf = time.perf_counter
_get_ident = threading.get_ident
DISCOVERY_STEPS = 2  # global forward hooks find the root modules during the first steps


def _not_compiling() -> bool:
    return False


# ``torch.compiler.is_compiling`` once the core is installed (set_compiling_check). Each forward
# hook returns at once while dynamo traces it: under torch.compile the hooks of the modules
# inside the compiled region are traced into the graph, and their Python (thread ids, the
# clock) would make dynamo break the graph — or skip the user's whole function — where the
# script alone compiles cleanly. Traced as the constant True, the check leaves nothing behind.
_is_compiling = _not_compiling


def set_compiling_check(fn: Any) -> None:
    global _is_compiling
    _is_compiling = fn or _not_compiling


def _builds_graph(output: Any) -> bool:
    """True if a module's output (a tensor, or one in a tuple/list/dict) requires grad."""
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return any(getattr(o, "requires_grad", False) is True for o in output[:8])
    return getattr(output, "requires_grad", False) is True


class StepClock:
    """Mixin of the core: forward (roots), backward, the step boundary, CUDA phase timing."""

    # ------------------------------------------------------------------ forward (roots)
    def _remove_global_fwd(self) -> None:
        for h in self.global_fwd_handles:
            h.remove()
        self.global_fwd_handles = []

    def _g_fwd_pre(self, module, args):
        if _is_compiling():
            return None
        if not self._here():
            return None
        if self.fwd_depth == 0:
            # a module called while a batch is fetched (a transform in Dataset.__getitem__) is
            # data work, not the model: its time is data wait already
            if os.getpid() != self.ctx._owner_pid or self.bwd_depth or self.ctx.phase == "data":
                return None
            self._root_begin()
            if next(module.parameters(), None) is not None:
                self._add_root(module)
            # a parameterless root (transform, loss) is judged by its output in the post hook
        self.fwd_depth += 1
        return None

    def _add_root(self, module) -> None:
        if self.ctx._add_model(module):
            self.ctx.emit("model", cls=type(module).__name__, step=self.ctx.step,
                          params=sum(p.numel() for p in module.parameters()))

    def _g_fwd_post(self, module, args, output):
        if _is_compiling():
            return None
        if self.fwd_depth > 0 and self._here():
            self.fwd_depth -= 1
            if self.fwd_depth == 0:
                if next(module.parameters(), None) is None:
                    if not _builds_graph(output):  # Normalize-style transform in the loop: not
                        self.ctx.phase = "other"   # the model, its time stays "other"
                        return None
                    self._add_root(module)  # a loss module: part of the training forward
                self._root_end()
        return None

    def _root_pre(self, module, args):
        if _is_compiling():
            return None
        if not self._here():
            return None
        if (self.fwd_depth == 0 and not self.bwd_depth and os.getpid() == self.ctx._owner_pid
                and self.ctx.phase != "data"):
            self._root_begin()
        self.fwd_depth += 1
        return None

    def _root_post(self, module, args, output):
        if _is_compiling():
            return None
        if self.fwd_depth > 0 and self._here():
            self.fwd_depth -= 1
            if self.fwd_depth == 0:
                self._root_end()
        return None

    def _switch_to_root_hooks(self) -> None:
        """After discovery: drop the global hooks (they slow every module call) for per-root ones.

        Only when every root's copies and pickles leave the hooks out (:func:`hookable`): a
        root whose class has its own ``__getstate__`` (``nn.LSTM``) keeps the global hooks on,
        so that nothing of torchdoctor's travels into the user's ``deepcopy`` or saved file.
        Not once torch.compile has compiled something: the global hooks stay (they return at
        once inside compiled code) because changing them is a recompile of every compiled
        function."""
        from torchdoctor import torch_internals as ti
        from torchdoctor.runner.userhooks import hookable, register_on

        if ti.dynamo_compiled_anything():
            # dynamo guards on the set of global module hooks: removing ours now would make
            # every function it compiled recompile (a compiled submodule, a compiled root)
            return
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
    def _bwd_begin(self, tensor: Any) -> bool:
        """Outermost backward entered; False when the call is not the clock thread's."""
        if os.getpid() != self.ctx._owner_pid or not self._here(training=True):
            return False
        self.bwd_depth += 1
        if self.bwd_depth != 1:
            return True
        self.ctx.last_backward_tensor = tensor
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
        self._dispatch("on_backward_begin", self.ctx)
        return True

    def _bwd_end(self, mine: bool) -> None:
        if not mine:
            # another thread's backward: the clock may adopt it (no optimizer, main idle)
            if (self.ctx._train_tid is not None or self.n_optimizers_built
                    or os.getpid() != self.ctx._owner_pid or not self._fix_clock()):
                return
            self.bwd_depth = 1  # its start was not seen: taken as the outermost backward
            self.t_phase = self.t_start = _perf()
        self.bwd_depth -= 1
        if self.bwd_depth != 0:
            return
        # read at on_backward_begin only: not kept past the backward (a loss can be a view of
        # a large buffer, and the script may drop it before the step ends)
        self.ctx.last_backward_tensor = None
        self.bwd_s += _perf() - self.t_phase
        self.backwards += 1
        self.ctx.phase = "other"
        if self.cuda is not None:
            self.cuda.mark("backward", 1)
        self._dispatch("on_backward_end", self.ctx)
        if self.n_optimizers_built == 0 and self.source != "optimizer":
            if self.ctx._train_tid is None and not self._fix_clock():
                return
            self.source = "backward"
            self._boundary()

    # ------------------------------------------------------------------ step boundary
    def _boundary(self, at: tuple | None = None) -> None:
        """End the current step now, or (``at``: the clock's counters remembered at an earlier
        optimizer step, while the cycle of several optimizers was learned) where it ended."""
        ctx = self.ctx
        if at is None:
            now = _perf()
            data, fwd, bwd, opt, batches, backwards = (self.data_s, self.fwd_s, self.bwd_s,
                                                       self.opt_s, self.batches, self.backwards)
        else:
            now, data, fwd, bwd, opt, batches, backwards = at
        start = self.t_start if self.t_start is not None else now
        wall = now - start
        ctx.step += 1
        step = ctx.step
        busy = data + fwd + bwd + opt
        ctx.emit("step", step=step, wall_s=round(wall, 7), data_s=round(data, 7),
                 forward_s=round(fwd, 7), backward_s=round(bwd, 7),
                 optimizer_s=round(opt, 7), other_s=round(max(0.0, wall - busy), 7),
                 batches=batches, backwards=backwards, source=self.source)
        if self.cuda is None:
            self._maybe_cuda()
        if self.cuda is not None:
            self.cuda.step_end(step, wall)
        # what came after ``at`` belongs to the next step
        self.data_s -= data
        self.fwd_s -= fwd
        self.bwd_s -= bwd
        self.opt_s -= opt
        self.batches -= batches
        self.backwards -= backwards
        if step == 1:
            self._safe("stepclock", "device", emit_device, ctx)
        if step == DISCOVERY_STEPS:
            self._switch_to_root_hooks()
        self._dispatch("on_step_end", ctx, step)
        self.t_start = _perf() if at is None else now
        if self.max_steps and step >= self.max_steps:
            ctx.request_stop(f"--steps {self.max_steps} reached")
        if ctx.stop_reason is not None:
            if _get_ident() == self.main_tid:
                raise StopRun(ctx.stop_reason)
            if not self.stop_deferred:  # never kill a thread of the script with our exception
                self.stop_deferred = True
                ctx.emit("stop_deferred", step=step, reason=ctx.stop_reason,
                         thread=threading.current_thread().name)

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
