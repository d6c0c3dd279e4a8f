"""The training objects a script built, as the save audit compares a save against them.

Models and optimizers the step clock already sees (``ctx.models()``: roots seen in forward;
``ctx.optimizers``: optimizers seen stepping). LR schedulers and GradScalers it does not: this
module wraps their constructors (``LRScheduler.__init__``, ``ReduceLROnPlateau.__init__``, which
does not call the base one, and ``torch.amp.GradScaler.__init__``, which ``torch.cuda.amp`` and
``torch.cpu.amp`` GradScalers call) and keeps a weak reference to each object built in the owner
process: nothing is stored on the objects, nothing runs per step. ``on_built(kind, obj)`` lets
the resume check take a fresh object's state (``save_audit_reset.py``).

:func:`live_facts` describes them at a save (classes, sizes, whether an optimizer holds state,
which optimizer a scheduler drives, whether a scaler is enabled): cheap attribute reads, no
tensor data read, no device sync.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

MAX_GROUPS = 4  # param groups listed per optimizer
MAX_LIVE = 16  # live objects of each kind described (a script rarely builds more)


class Live:
    """Weak lists of the LR schedulers and GradScalers the script built."""

    def __init__(self) -> None:
        self._schedulers: list[weakref.ref] = []
        self._scalers: list[weakref.ref] = []
        self.on_built: Callable[[str, Any], None] | None = None
        self.active = True

    def install(self, ctx: Any, patches: Any) -> None:
        from torch.amp import grad_scaler
        from torch.optim import lr_scheduler

        for owner in (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau):
            if "__init__" in vars(owner):
                patches.wrap(owner, "__init__", self._maker(ctx, "scheduler"), tag="save_audit")
        patches.wrap(grad_scaler.GradScaler, "__init__", self._maker(ctx, "scaler"), tag="save_audit")

    def _maker(self, ctx: Any, kind: str) -> Callable[[Any], Any]:
        live = self

        def make(orig):
            @functools.wraps(orig)
            def init(obj, *a, **k):
                orig(obj, *a, **k)
                if live.active and ctx.in_owner_process():
                    try:
                        live._add(kind, obj)
                    except Exception:  # noqa: BLE001 - never into the user's constructor: unseen, not broken
                        pass
            return init
        return make

    def _add(self, kind: str, obj: Any) -> None:
        refs = self._schedulers if kind == "scheduler" else self._scalers
        if any(r() is obj for r in refs):
            return  # a subclass's __init__ ran the base one too
        try:
            refs.append(weakref.ref(obj))
        except TypeError:
            return
        if self.on_built is not None:
            self.on_built(kind, obj)

    def schedulers(self) -> list[Any]:
        return [s for s in (r() for r in self._schedulers) if s is not None]

    def scalers(self) -> list[Any]:
        return [s for s in (r() for r in self._scalers) if s is not None]

    def optimizers(self, ctx: Any) -> list[Any]:
        """Optimizers seen stepping, then those only a scheduler names (first-seen order)."""
        out = list(ctx.optimizers)
        for s in self.schedulers():
            o = getattr(s, "optimizer", None)
            if o is not None and all(o is not x for x in out):
                out.append(o)
        return out


def models_with_weights(ctx: Any) -> list[Any]:
    return [m for m in ctx.models() if next(m.parameters(), None) is not None]


def _num(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def live_facts(ctx: Any, live: Live) -> dict:
    """What was live at the save: JSON-safe, bounded."""
    models = models_with_weights(ctx)[:MAX_LIVE]
    opts = live.optimizers(ctx)[:MAX_LIVE]
    scheds = live.schedulers()[:MAX_LIVE]
    out: dict[str, Any] = {
        "models": [{"cls": type(m).__name__, "params": sum(p.numel() for p in m.parameters()),
                    "device": str(next(m.parameters()).device)} for m in models],
        "optimizers": [{"cls": type(o).__name__, "stateful": bool(len(o.state)),
                        "scheduled": any(getattr(s, "optimizer", None) is o for s in scheds),
                        "groups": [len(g.get("params", ())) for g in o.param_groups],
                        "lr": [_num(g.get("lr")) for g in o.param_groups[:MAX_GROUPS]]} for o in opts],
        "schedulers": [{"cls": type(s).__name__, "last_epoch": _num(getattr(s, "last_epoch", None)),
                        "optimizer": next((i for i, o in enumerate(opts) if getattr(s, "optimizer", None) is o),
                                          None)} for s in scheds],
        "scalers": [{"cls": type(s).__name__, "enabled": bool(s.is_enabled())} for s in live.scalers()[:MAX_LIVE]],
    }
    return out
