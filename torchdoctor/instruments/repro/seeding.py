"""Seeding calls: wraps the global RNG seeding functions to see whether the script seeds.

Wrapped (module attributes, so ``torch.manual_seed(0)`` and ``from torch import manual_seed``
written after start-up both go through the wrapper): ``torch.manual_seed``,
``torch.random.manual_seed``, ``torch.cuda.manual_seed(_all)``, ``random.seed``,
``numpy.random.seed`` and ``numpy.random.default_rng(seed)``. Cost: nothing per step (only the
seeding calls themselves are wrapped). Calls in forked DataLoader workers (torch seeds each
worker) are ignored. Events: ``seed`` {fn, seeded, where} for the first calls; ``seeding``
{calls, fns} at the end.
"""

from __future__ import annotations

import functools
import random
import sys
from typing import Any

from torchdoctor.instruments.base import Instrument, register

MAX_EVENTS = 8


@register
class Seeding(Instrument):
    name = "seeding"
    produces = frozenset({"seeding", "seed"})
    priority = 80

    def install(self, ctx: Any) -> None:
        import torch

        from torchdoctor.runner.patching import Patches

        self.calls: list[str] = []
        self.live = True
        self._patches = Patches()
        self._wrap(ctx, torch, "manual_seed", "torch.manual_seed")
        self._wrap(ctx, torch.random, "manual_seed", "torch.random.manual_seed")
        self._wrap(ctx, torch.cuda, "manual_seed", "torch.cuda.manual_seed")
        self._wrap(ctx, torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all")
        self._wrap(ctx, random, "seed", "random.seed")
        np = sys.modules.get("numpy")  # torch imports numpy when it is installed
        if np is not None:
            self._wrap(ctx, np.random, "seed", "numpy.random.seed")
            self._wrap(ctx, np.random, "default_rng", "numpy.random.default_rng", needs_arg=True)

    def _wrap(self, ctx: Any, owner: Any, attr: str, label: str, needs_arg: bool = False) -> None:
        inst = self

        def make(orig):
            @functools.wraps(orig)
            def wrapper(*a, **k):
                if inst.live and ctx.in_owner_process():
                    seeded = bool(a or k.get("seed") is not None) if needs_arg else \
                        not (a and a[0] is None) and not (k.get("a", 0) is None)
                    if seeded:
                        inst._record(ctx, label)
                return orig(*a, **k)
            return wrapper

        self._patches.wrap(owner, attr, make, tag="seed", require=False)

    def _record(self, ctx: Any, label: str) -> None:
        from torchdoctor.runner.frames import user_frame

        self.calls.append(label)
        if len(self.calls) <= MAX_EVENTS:
            uf = user_frame(3)
            ctx.emit("seed", fn=label, step=ctx.step,
                     where=f"{uf[0]}:{uf[1]}" if uf else None)

    def uninstall(self, ctx: Any) -> None:
        self.live = False  # a wrapper someone re-wrapped stays, inert
        if getattr(self, "_patches", None) is not None:
            self._patches.undo()
        ctx.emit("seeding", calls=len(getattr(self, "calls", [])),
                 fns=sorted(set(getattr(self, "calls", []))))
