"""Two facts the save audit adds to what a save holds: schedulers driven by an explicit counter, and renames.

**Counter-driven schedulers.** The constructor wrap (``save_audit_live.py``) sees torch's LR
schedulers only. timm's (and many hand-written ones) are other classes: they hold the optimizer
as ``.optimizer`` and set the LR from the epoch or update count the script passes to each call,
``lr_scheduler.step(epoch)`` / ``step_update(num_updates=n)``; a run resumed from a checkpoint
that keeps the epoch resumes the schedule with ``lr_scheduler.step(start_epoch)``. At the end of
the first optimizer step, for each stepping optimizer whose param groups carry ``initial_lr`` (a
scheduler is attached) and that no torch scheduler drives, the objects referring to it are looked
up once (``gc.get_referrers``: one heap scan per such optimizer, once per run); an object with
``.optimizer`` being it and callable ``step`` and ``state_dict`` is a scheduler. Its class's
``step`` and ``step_update`` are wrapped (class attributes, undone at the end; nothing stored on
the object) to count the calls and those given a number as their first argument or as a counter
keyword (:data:`COUNTER_KWARGS`). :meth:`Counted.facts` reports them per class at a save.
Cost: the scan happens only for such an optimizer (a torch scheduler drives the usual one): 178 ms
once on a heap of 287 000 tracked objects (CPU box, loaded); nothing per step but one counter
increment per scheduler call.

**Renames.** A script that writes ``tmp.pth.tar`` and renames it to ``last.pth.tar`` (timm's
``CheckpointSaver``) keeps the second name. ``os.rename`` / ``os.replace`` are wrapped while the
audit is installed; a rename of a path a save wrote is recorded (base names, bounded), so the
finding names the file the user keeps.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

COUNTER_KWARGS = ("epoch", "num_updates", "step", "global_step", "iteration", "t", "num_steps")
MAX_SAVED_PATHS = 64  # saved paths remembered for the rename record
MAX_RENAMES = 32


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Counted:
    def __init__(self, ctx: Any, live: Any, patches: Any) -> None:
        self.ctx, self.live, self.patches = ctx, live, patches
        self.looked = False
        self.on = True
        self.calls: dict[str, list[int]] = {}  # class name -> [calls, calls with a counter]
        self.optimizer_of: dict[str, int] = {}  # class name -> index of the optimizer it drives
        self.saved: dict[str, None] = {}  # absolute paths written by a save (ordered, bounded)
        self.renames: list[list[str]] = []  # [old base name, new base name]
        self._lock = threading.Lock()

    # -- counter-driven schedulers -------------------------------------------------------------
    def look(self) -> None:
        """Once, at the end of the first optimizer step: find schedulers torch's wrap does not see."""
        if self.looked:
            return
        self.looked = True
        driven = {id(getattr(s, "optimizer", None)) for s in self.live.schedulers()}
        for i, opt in enumerate(list(self.ctx.optimizers)[:8]):
            groups = getattr(opt, "param_groups", None) or []
            if id(opt) in driven or not any(isinstance(g, dict) and "initial_lr" in g for g in groups):
                continue
            for sched in _referring_schedulers(opt):
                self._wrap(type(sched))
                self.optimizer_of.setdefault(type(sched).__name__, i)

    def _wrap(self, cls: type) -> None:
        name = cls.__name__
        if name in self.calls:
            return
        self.calls[name] = [0, 0]
        for meth in ("step", "step_update"):
            if callable(getattr(cls, meth, None)):
                self.patches.wrap(cls, meth, self._maker(name), tag="save_audit_counted", require=False)

    def _maker(self, name: str):
        rec = self

        def make(orig):
            @functools.wraps(orig)
            def step(obj, *a, **k):
                if rec.on:
                    try:
                        counter = _is_num(a[0]) if a else any(_is_num(k.get(c)) for c in COUNTER_KWARGS)
                        c = rec.calls[name]
                        c[0] += 1
                        c[1] += int(counter)
                    except Exception:  # noqa: BLE001 - counting never breaks the user's step
                        pass
                return orig(obj, *a, **k)
            return step
        return make

    def facts(self) -> list[dict]:
        return [{"cls": n, "calls": c[0], "with_counter": c[1], "optimizer": self.optimizer_of.get(n)}
                for n, c in list(self.calls.items())[:8]]

    # -- renames -------------------------------------------------------------------------------
    def install_renames(self) -> None:
        for fn in ("rename", "replace"):
            self.patches.wrap(os, fn, self._rename_maker(), tag="save_audit_counted", require=False)

    def saved_path(self, path: str | None) -> None:
        if path and len(self.saved) < MAX_SAVED_PATHS:
            with self._lock:
                self.saved[path] = None

    def _rename_maker(self):
        rec = self

        def make(orig):
            @functools.wraps(orig)
            def rename(src, dst, *a, **k):
                out = orig(src, dst, *a, **k)
                if rec.on and rec.saved:
                    try:
                        s = os.path.abspath(os.fsdecode(src))
                        if s in rec.saved and len(rec.renames) < MAX_RENAMES:
                            d = os.path.abspath(os.fsdecode(dst))
                            pair = [os.path.basename(s), os.path.basename(d) if os.path.dirname(d) ==
                                    os.path.dirname(s) else d]
                            with rec._lock:
                                if pair not in rec.renames:
                                    rec.renames.append(pair)
                    except Exception:  # noqa: BLE001 - the user's rename already happened
                        pass
                return out
            return rename
        return make


def _referring_schedulers(opt: Any) -> list[Any]:
    import gc

    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    refs = gc.get_referrers(opt)
    cands = [r for r in refs if not isinstance(r, dict)]
    dicts = [r for r in refs if isinstance(r, dict)][:16]
    if dicts:  # an instance whose __dict__ was materialised is referred to through it
        cands += [o for o in gc.get_referrers(*dicts) if any(getattr(o, "__dict__", None) is d for d in dicts)]
    out = []
    for o in cands:
        if isinstance(o, (Optimizer, LRScheduler, ReduceLROnPlateau, type)) or any(x is o for x in out):
            continue
        try:
            if getattr(o, "optimizer", None) is opt and callable(getattr(type(o), "step", None)) \
                    and callable(getattr(o, "state_dict", None)):
                out.append(o)
        except Exception:  # noqa: BLE001 - a strange object's attribute access
            continue
    return out[:4]
