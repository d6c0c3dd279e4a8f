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
  step that completes the run, i.e. exactly at a step boundary, in the main thread only.

Several optimizers (a GAN's generator and discriminator, WGAN's critic stepping five times per
generator step, an encoder/decoder pair): a training step is one iteration of the outer loop,
i.e. one period of the cycle of optimizer steps. While the cycle is unknown (more than one
optimizer was built by the clock's thread), no boundary is made; the steps are remembered
with the clock's counters at each. The cycle is known when the first optimizer that stepped
steps again after every optimizer built has stepped; its last optimizer (the one that
stepped just before the first came back) closes every iteration from then on, and the
iterations already run are cut at its remembered steps. An optimizer stepping more than
``LEARN_REPEATS`` times ends the learning all the same (an optimizer built and never used;
the first optimizer never stepping again: then that optimizer closes the iterations). An optimizer that first steps later
(a phase that adds one, an optimizer re-created each epoch) closes the iterations from then on.

Threads: the step clock follows one thread: the main thread, or, when the main thread does
not train (it has run no backward nor optimizer step, and waits for other threads: its
innermost frames are in ``threading``/``queue``/``concurrent.futures``..., e.g. ``join()``)
at another thread's step boundary, that thread (after ``ADOPT_AFTER`` such boundaries, the
main thread doing something else, the clock follows that thread all the same).
Hooks called from other threads (and after teardown began) return at once: instruments see
one thread's loop, their state is never shared between threads. ``ctx.in_owner_thread()``
tells instruments' own hooks the same. :class:`StopRun` is raised only in the main thread: a
script whose loop runs in another thread is not cut at ``--steps`` (it runs to its end or to
``--timeout``), and no thread of the script dies of torchdoctor's exception.

Events written (one line each, at most two per step):
``step`` {step, wall_s, data_s, forward_s, backward_s, optimizer_s, other_s, batches,
backwards, source}; ``step_device`` {step, forward_ms, backward_ms, optimizer_ms, span_ms,
busy}; ``dataloader`` once per iterator; ``models`` when roots are discovered.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any

from torchdoctor.runner.context import HarnessContext, StopRun

_perf = time.perf_counter
_get_ident = threading.get_ident
DISCOVERY_STEPS = 2  # global forward hooks find the root modules during the first steps
# several optimizers: the first optimizer coming back this often with some built optimizer
# still never stepped ends the learning of the cycle all the same (an optimizer built, unused)
LEARN_REPEATS = 8
LEARN_MAX = 4096  # optimizer steps remembered while the cycle is learned
# threads: another thread's boundaries seen while the main thread neither trained nor waited
# for other threads, after which the clock follows that thread all the same
ADOPT_AFTER = 64
_WAITING_MODULES = ("threading", "queue", "concurrent.futures", "multiprocessing", "asyncio")


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


def _builds_graph(output: Any) -> bool:
    """True if a module's output (a tensor, or one in a tuple/list/dict) requires grad."""
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return any(getattr(o, "requires_grad", False) is True for o in output[:8])
    return getattr(output, "requires_grad", False) is True


def loader_facts(it: Any) -> dict[str, Any]:
    """What a DataLoader iterator says of its loader: workers, pinning, batch size, dataset,
    the user's ``__getitem__`` and the user's line that iterates it (the step clock's
    ``dataloader`` event and the data-source instrument's ``data_loader`` event)."""
    from torchdoctor.runner.frames import is_user_file

    ds = getattr(it, "_dataset", None)
    code = getattr(getattr(type(ds), "__getitem__", None), "__code__", None)
    # a library dataset's own file says little: only a user's __getitem__ is named
    getitem = (f"{code.co_filename}:{code.co_firstlineno}"
               if code is not None and is_user_file(code.co_filename) else None)
    loop = user_frame(2)
    return {"num_workers": getattr(it, "_num_workers", None),
            "pin_memory": bool(getattr(it, "_pin_memory", False)),
            "prefetch_factor": getattr(it, "_prefetch_factor", None),
            "persistent_workers": bool(getattr(it, "_persistent_workers", False)),
            "batch_size": getattr(getattr(it, "_index_sampler", None), "batch_size", None),
            "dataset": type(ds).__name__ if ds is not None else None, "getitem": getitem,
            "loop": f"{loop[0]}:{loop[1]}" if loop else None, "iterator": type(it).__name__}


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
        self.built_by: dict[int, int] = {}  # thread ident -> optimizers it built
        self.source = None  # "optimizer" | "backward"
        self.closing_opt: int | None = None  # id of the optimizer whose step ends an iteration
        self.opt_seen: set[int] = set()  # optimizers that stepped (ids)
        self.learn_seq: list[tuple[int, tuple]] = []  # (optimizer id, counters) while learning
        self.learn_counts: dict[int, int] = {}  # optimizer id -> steps while learning
        # threads (see "Threads" above)
        self.main_tid = ctx._main_tid
        self.main_trained = False  # the main thread ran backward / an optimizer step
        self.foreign_boundaries = 0  # other threads' boundaries while the clock was not fixed
        self.closed = False  # teardown began: every hook returns at once
        self.stop_deferred = False
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
                tid = _get_ident()
                core.built_by[tid] = core.built_by.get(tid, 0) + 1

        optim_mod.Optimizer.__init__ = opt_init
        self._undo.append(lambda: setattr(optim_mod.Optimizer, "__init__", orig_init))

        # backward: torch.autograd.backward and Tensor.backward (the latter calls the former)
        orig_ab = torch.autograd.backward
        orig_tb = torch.Tensor.backward

        def autograd_backward(*a, **k):
            # the tensor being backpropagated (nan/training instruments)
            mine = core._bwd_begin(a[0] if a else k.get("tensors"))
            try:
                return orig_ab(*a, **k)
            finally:
                core._bwd_end(mine)

        def tensor_backward(self_t, *a, **k):
            mine = core._bwd_begin(self_t)
            try:
                return orig_tb(self_t, *a, **k)
            finally:
                core._bwd_end(mine)

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
        # from now on every hook of the core returns at once (a daemon thread of the script may
        # still be training), and instruments' own hooks too (``ctx.in_owner_thread``)
        self.closed = True
        self.ctx._train_tid = -1
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

    # ------------------------------------------------------------------ threads
    def _here(self, training: bool = False) -> bool:
        """True when the calling thread is the one the step clock follows (module doc,
        "Threads"). ``training``: the call is backward or an optimizer step, which marks the
        main thread as training, or another thread as a trainer besides the clock's."""
        tid = _get_ident()
        clock = self.ctx._train_tid
        if tid == clock:
            return True
        if clock is None and tid == self.main_tid and not self.closed:
            if training:
                self.main_trained = True
            return True
        if training:
            self.ctx._other_trainers.add(tid)
        return False

    def _fix_clock(self) -> bool:
        """At a step boundary while no clock thread is fixed: the main thread's, or another
        thread's while the main thread does not train (module doc, "Threads"). True if the
        calling thread is now the clock's."""
        tid = _get_ident()
        if self.closed:
            return False
        if tid != self.main_tid:
            if self.main_trained:
                return False
            self.foreign_boundaries += 1
            if not self._main_waits() and self.foreign_boundaries < ADOPT_AFTER:
                return False
        self.ctx._train_tid = tid
        self.ctx._other_trainers.discard(tid)
        return True

    def _main_waits(self) -> bool:
        """The main thread is blocked waiting for others (``join()``, ``Event.wait()``, a
        queue, a future), not starting them: it does not train meanwhile."""
        f = sys._current_frames().get(self.main_tid)
        if f is None:
            return True
        waiting = False
        while f is not None:
            mod = f.f_globals.get("__name__", "")
            if not mod.startswith(_WAITING_MODULES):
                break
            if f.f_code.co_name == "start":  # Thread.start() waits for the thread to run
                return False
            waiting = True
            f = f.f_back
        return waiting

    # ------------------------------------------------------------------ forward (roots)
    def _remove_global_fwd(self) -> None:
        for h in self.global_fwd_handles:
            h.remove()
        self.global_fwd_handles = []

    def _g_fwd_pre(self, module, args):
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
        if not self._here():
            return None
        if (self.fwd_depth == 0 and not self.bwd_depth and os.getpid() == self.ctx._owner_pid
                and self.ctx.phase != "data"):
            self._root_begin()
        self.fwd_depth += 1
        return None

    def _root_post(self, module, args, output):
        if self.fwd_depth > 0 and self._here():
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
        for name, fn in self.cb["on_backward_begin"]:
            try:
                fn(self.ctx)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_backward_begin")
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
            if self.ctx._train_tid is None and not self._fix_clock():
                return
            self.source = "backward"
            self._boundary()

    # ------------------------------------------------------------------ optimizer
    def _opt_pre(self, opt, args, kwargs):
        if os.getpid() != self.ctx._owner_pid or not self._here(training=True):
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
        if not self._here(training=True) and not (self.ctx._train_tid is None and self._fix_clock()):
            return None
        if self.ctx._train_tid is None:
            self._fix_clock()  # the main thread's first step
        if self.ctx.phase == "optimizer":  # (a thread just adopted: its pre hook was not seen)
            self.opt_s += _perf() - self.t_phase
        self.ctx.phase = "other"
        if self.cuda is not None:
            self.cuda.mark("optimizer", 1)
        self.ctx._add_optimizer(opt)
        self.source = "optimizer"
        oid = id(opt)
        if self.closing_opt is None:
            self._learn(oid)
        elif oid == self.closing_opt or oid not in self.opt_seen:
            # a new optimizer (a phase that adds one, one re-created per epoch) closes from now on
            self.closing_opt = oid
            self.opt_seen.add(oid)
            self._boundary()
        return None

    def _learn(self, oid: int) -> None:
        """The cycle of optimizer steps, while it is unknown (module doc, "Several optimizers")."""
        seq = self.learn_seq
        built = self.built_by.get(_get_ident(), 0)
        if not seq and built <= 1:  # one optimizer: each of its steps ends an iteration
            self.closing_opt = oid
            self.opt_seen.add(oid)
            self._boundary()
            return
        counts = self.learn_counts
        counts[oid] = counts.get(oid, 0) + 1
        first = seq[0][0] if seq else oid
        if seq and ((oid == first and len(counts) >= built) or counts[oid] > LEARN_REPEATS
                    or len(seq) >= LEARN_MAX):
            # known: the first optimizer came back after every built one stepped; or one came
            # back LEARN_REPEATS times (an optimizer built, unused; the first never again)
            last = seq[-1][0] if oid == first else oid  # the one that ends an iteration
            self.closing_opt = last
            self.opt_seen |= set(counts)
            self.learn_seq = []
            self.learn_counts = {}
            done = (0.0, 0.0, 0.0, 0.0, 0, 0)  # counters given to earlier cut steps
            for o, (t, *counters) in seq:  # the iterations already run, cut where they ended
                if o == last:
                    self._boundary(at=(t, *(c - d for c, d in zip(counters, done))))
                    done = tuple(counters)
            if oid == last:
                self._boundary()
            return
        seq.append((oid, (_perf(), self.data_s, self.fwd_s, self.bwd_s, self.opt_s,
                          self.batches, self.backwards)))

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
            from torchdoctor.runner.harness import emit_device

            self._safe("stepclock", "device", emit_device, ctx)
        if step == DISCOVERY_STEPS:
            self._switch_to_root_hooks()
        for name, fn in self.cb["on_step_end"]:
            try:
                fn(ctx, step)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, "on_step_end")
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

    # ------------------------------------------------------------------ data loader facts
    def _describe_loader(self, it) -> None:
        try:
            try:
                self.loaders_seen.add(it)
            except TypeError:  # an iterator class with __slots__ and no weakref: described again
                pass
            self.ctx.emit("dataloader", step=self.ctx.step, **loader_facts(it))
        except Exception:  # noqa: BLE001
            self._instrument_failed("stepclock", "dataloader")
