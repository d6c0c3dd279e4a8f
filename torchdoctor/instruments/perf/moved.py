"""Module moves: ``nn.Module.to/.cuda/.cpu`` calls per step, and whether they really copy.

Wraps the three methods on ``nn.Module`` (children are moved through ``_apply``, so one
user call is one count). Per call: the first parameter's device/dtype before and after
(a real move changes it; a repeated ``model.to(device)`` is a no-op that still walks every
parameter) and the time spent. Cost: only the move calls themselves, plus one call-site
lookup. Events: ``module_moves`` {step, calls, real, time_s, site, module} for each step in
which the script moved a module (at most one per step), then ``module_moves_summary``.
"""

from __future__ import annotations

import time
from typing import Any

from torchdoctor.instruments.base import Instrument, register


def _first_param_state(module: Any) -> tuple | None:
    for p in module.parameters():
        return (p.device, p.dtype)
    for b in module.buffers():
        return (b.device, b.dtype)
    return None


@register
class ModuleMoves(Instrument):
    name = "moved"
    produces = frozenset({"module_moves", "module_moves_summary"})
    priority = 60

    def install(self, ctx: Any) -> None:
        import torch

        from torchdoctor.runner.patching import Patches

        Module = torch.nn.Module
        self._patches = Patches()  # undone only where our wrapper is still on top
        self.calls = self.real = 0
        self.time_s = 0.0
        self.site: str | None = None
        self.module: str | None = None
        self.steps_with_moves = 0
        self.depth = 0
        inst = self

        def make(name: str, orig):
            def wrapper(module, *a, **k):
                if inst.depth or not ctx.in_owner_thread():
                    return orig(module, *a, **k)
                inst.depth += 1
                try:
                    before = _first_param_state(module)
                    t0 = time.perf_counter()
                    out = orig(module, *a, **k)
                    inst.time_s += time.perf_counter() - t0
                    if before is not None:
                        inst.calls += 1
                        if _first_param_state(module) != before:
                            inst.real += 1
                        if inst.site is None:
                            from torchdoctor.runner.frames import user_frame

                            uf = user_frame(2)
                            inst.site = f"{uf[0]}:{uf[1]}" if uf else None
                            inst.module = type(module).__name__
                    return out
                finally:
                    inst.depth -= 1

            wrapper.__wrapped__ = orig
            wrapper.__name__ = name
            return wrapper

        for n in ("to", "cuda", "cpu"):
            self._patches.wrap(Module, n, lambda orig, n=n: make(n, orig))

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.calls:
            ctx.emit("module_moves", step=step, calls=self.calls, real=self.real,
                     time_s=round(self.time_s, 7), site=self.site, module=self.module)
            self.steps_with_moves += 1
            self.calls = self.real = 0
            self.time_s = 0.0
            self.site = self.module = None

    def uninstall(self, ctx: Any) -> None:
        if getattr(self, "_patches", None) is not None:
            self._patches.undo()
        ctx.emit("module_moves_summary", steps_with_moves=getattr(self, "steps_with_moves", 0))
