"""The harness core: installs the loop patches and the step clock, dispatches to instruments.

Installed once in the child, before the user's script runs. The jobs live in their modules,
mixed into :class:`Core` (one object, so the hot paths stay plain attribute accesses):

* :mod:`torchdoctor.runner.looppatches`: the patches that see the loop (optimizer
  construction, backward, DataLoader ``__next__``, global forward hooks), made and undone with
  :class:`torchdoctor.runner.patching.Patches`;
* :mod:`torchdoctor.runner.stepclock`: step boundaries, phases and the time split per step;
* :mod:`torchdoctor.runner.cycle`: optimizer steps as boundaries, the cycle of several
  optimizers;
* :mod:`torchdoctor.runner.clockthread`: which thread the clock follows;
* here: calling each armed instrument's callbacks; a callback that raises is disabled and
  reported (``instrument_error`` event), never propagated into the user's code; the
  ``dataloader`` event once per iterator.
"""

from __future__ import annotations

import traceback
import weakref
from typing import Any

from torchdoctor.instruments.base import CALLBACKS
from torchdoctor.runner.clockthread import ADOPT_AFTER, ThreadFollow  # noqa: F401 - re-exported
from torchdoctor.runner.context import HarnessContext
from torchdoctor.runner.cycle import LEARN_MAX, LEARN_REPEATS, OptimizerCycle  # noqa: F401
from torchdoctor.runner.frames import user_frame  # noqa: F401 - re-exported
from torchdoctor.runner.loaders import loader_facts
from torchdoctor.runner.patching import Patches
from torchdoctor.runner.stepclock import DISCOVERY_STEPS, StepClock  # noqa: F401


class Core(StepClock, OptimizerCycle, ThreadFollow):
    """Patches + step clock + instrument dispatch. ``install()`` then ``uninstall()`` once."""

    def __init__(self, ctx: HarnessContext, instruments: list[Any]):
        self.ctx = ctx
        self.instruments = instruments
        steps = ctx.options.get("steps")
        self.max_steps = int(steps) if steps else 0
        self._undo: list[Any] = []
        self._patches = Patches()
        self._errors: set[str] = set()
        # callbacks of instruments that override them, in priority order
        self.cb = {name: [(i.name, getattr(i, name)) for i in instruments if i.overrides(name)]
                   for name in CALLBACKS}
        # clock state
        self.n_optimizers_built = 0
        self.built_by: dict[int, int] = {}  # thread ident -> optimizers it built
        self.source = None  # "optimizer" | "backward"
        self.closing_opt: int | None = None  # id of the optimizer whose step ends an iteration
        self.opt_seen: set[int] = set()  # optimizers that stepped (ids)
        self.learn_seq: list[tuple[int, tuple]] = []  # (optimizer id, counters) while learning
        self.learn_counts: dict[int, int] = {}  # optimizer id -> steps while learning
        # threads (see runner/clockthread.py)
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
        from torch.nn.modules import module as mod_mod
        from torch.optim import optimizer as optim_mod

        from torchdoctor.runner.looppatches import install_loop_patches
        from torchdoctor.runner.userhooks import install_state_filter

        self._torch = torch
        from torchdoctor.runner.stepclock import set_compiling_check

        set_compiling_check(getattr(getattr(torch, "compiler", None), "is_compiling", None))
        # hooks on the user's modules never travel into a deepcopy or a pickle of them
        self._undo.append(install_state_filter())
        h1 = optim_mod.register_optimizer_step_pre_hook(self._opt_pre)
        h2 = optim_mod.register_optimizer_step_post_hook(self._opt_post)
        self._undo += [h1.remove, h2.remove]
        self._undo.append(self._patches.undo)
        install_loop_patches(self, self._patches)
        # forward: discover root modules with global hooks, then hook only the roots
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
        self._dispatch("on_crash", self.ctx, exc)

    # ------------------------------------------------------------------ dispatch, failures
    def _dispatch(self, callback: str, *args: Any) -> None:
        """Call every armed instrument's ``callback``; one that raises is disabled.

        One Python call more per batch, backward and step than the loop inlined at each call
        site: 0.3-0.9 us a call on the 2-core box under load (timeit, session 6), a few us a
        step against steps of milliseconds: kept, for one failure path."""
        for name, fn in self.cb[callback]:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001
                self._instrument_failed(name, callback)

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
