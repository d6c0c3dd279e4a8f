"""Child side of ``treat``: the applier base class, the root-forward watch, the applier lookup.

Runs inside the user's process (imported by ``instruments/trials/treatment.py``). An :class:`Applier`
applies one treatment: it patches torch (through :class:`~torchdoctor.runner.patching.Patches`,
undone on uninstall), flips a flag (restored on uninstall) or treats the user's objects at
their first use, and notes each change it made with the user's file:line and the code to write
there (:meth:`Applier.change`) — the parent turns those notes into the trial's ``fix`` and
``where``. Nothing is stored on the user's objects beyond the stated change.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

MAX_CHANGES = 20  # notes kept per applier (a loader built every epoch is one site)


class Applier:
    """One treatment in the child. Subclasses set ``name`` and override what they need."""

    name = ""

    def __init__(self, value: str | None = None):
        from torchdoctor.runner.patching import Patches

        self.value = value
        self.changes: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.patches = Patches()
        self.live = True
        self.pid = os.getpid()

    # -- lifecycle ----------------------------------------------------------------------------
    def install(self, ctx: Any) -> None: ...

    def on_step_end(self, ctx: Any, step: int) -> None: ...

    def on_backward_begin(self, ctx: Any) -> None: ...

    def on_backward_end(self, ctx: Any) -> None: ...

    def wants_roots(self, step: int, together: frozenset) -> bool:
        """Whether :meth:`on_root` is still needed after ``step`` completed steps (0: before
        the first), in a trial of the treatments ``together``."""
        return False

    def on_root(self, ctx: Any, module: Any, args: tuple) -> tuple | None:
        """A root module's forward is about to run (depth 0, owner thread): return new
        positional args to replace them, or None."""
        return None

    def uninstall(self, ctx: Any) -> None:
        self.live = False
        self.patches.undo()

    # -- notes ----------------------------------------------------------------------------------
    def active(self) -> bool:
        return self.live and os.getpid() == self.pid

    def change(self, what: str, where: str | None, code: str) -> None:
        """Note one change: ``what`` (e.g. "DataLoader"), the user's ``file:line``, the code."""
        for c in self.changes:
            if c["what"] == what and c["where"] == where:
                c["count"] = c.get("count", 1) + 1
                return
        if len(self.changes) < MAX_CHANGES:
            self.changes.append({"what": what, "where": where, "code": code})

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_CHANGES:
            self.notes.append(text)

    def overridden(self, text: str) -> None:
        """The script undid the change (set the flag back itself): the run does not measure the
        treatment, so the trial is skipped with this reason rather than judged as noise."""
        self.note(text)
        self.undone = text

    def record(self) -> dict[str, Any]:
        out = {"name": self.name, "value": self.value, "changes": self.changes, "notes": self.notes}
        if getattr(self, "undone", None):
            out["overridden"] = self.undone
        return out


def applier_class(name: str) -> type[Applier]:
    """The applier of treatment ``name`` (its family module's ``APPLIERS``)."""
    from torchdoctor.treat.catalogue import lookup

    t = lookup(name)
    if t is None:
        raise KeyError(f"unknown treatment {name!r}")
    mod = importlib.import_module(f"torchdoctor.treat.{t.family}")
    return mod.APPLIERS[name]


class RootWatch:
    """Global forward pre/post hooks that call ``on_root(module, args)`` when an outermost
    module with parameters starts its forward in the training thread (not while a batch is
    fetched: a transform in ``__getitem__`` is data work). Global hooks keep nothing on the
    user's modules; ``stop()`` removes them."""

    def __init__(self, ctx: Any, on_root: Callable[[Any, tuple], tuple | None]):
        from torch.nn.modules import module as mod_mod

        self.ctx = ctx
        self.on_root = on_root
        self.depth = 0
        self.handles = [mod_mod.register_module_forward_pre_hook(self._pre),
                        mod_mod.register_module_forward_hook(self._post, always_call=True)]

    def _pre(self, module: Any, args: tuple) -> tuple | None:
        if not self.ctx.in_owner_thread():
            return None
        self.depth += 1
        if self.depth != 1 or self.ctx.phase == "data":
            return None
        try:
            if next(module.parameters(), None) is None:
                return None
        except Exception:  # noqa: BLE001 - a module whose parameters() fails: not a model
            return None
        return self.on_root(module, args)

    def _post(self, module: Any, args: tuple, output: Any) -> None:
        if self.depth > 0 and self.ctx.in_owner_thread():
            self.depth -= 1
        return None

    def stop(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def user_site(depth: int = 2) -> str | None:
    """``file:line`` of the nearest user frame above ``depth``."""
    from torchdoctor.instruments._sites import call_site

    return call_site(depth + 1)
