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

from torchdoctor.instruments import Instrument, register

MAX_EVENTS = 8


@register
class Seeding(Instrument):
    name = "seeding"
    produces = frozenset({"seeding", "seed"})
    priority = 80

    def install(self, ctx: Any) -> None:
        import torch

        self.calls: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []
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
        orig = getattr(owner, attr, None)
        if orig is None or getattr(orig, "_td_seed_wrapper", False):
            return
        inst = self

        @functools.wraps(orig)
        def wrapper(*a, **k):
            if ctx.in_owner_process():
                seeded = bool(a or k.get("seed") is not None) if needs_arg else \
                    not (a and a[0] is None) and not (k.get("a", 0) is None)
                if seeded:
                    inst._record(ctx, label)
            return orig(*a, **k)

        wrapper._td_seed_wrapper = True
        setattr(owner, attr, wrapper)
        self._undo.append((owner, attr, orig))

    def _record(self, ctx: Any, label: str) -> None:
        from torchdoctor.runner.core import user_frame

        self.calls.append(label)
        if len(self.calls) <= MAX_EVENTS:
            uf = user_frame(3)
            ctx.emit("seed", fn=label, step=ctx.step,
                     where=f"{uf[0]}:{uf[1]}" if uf else None)

    def uninstall(self, ctx: Any) -> None:
        for owner, attr, orig in reversed(getattr(self, "_undo", [])):
            setattr(owner, attr, orig)
        ctx.emit("seeding", calls=len(getattr(self, "calls", [])),
                 fns=sorted(set(getattr(self, "calls", []))))
