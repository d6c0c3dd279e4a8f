"""Model treatments (child): ``channels-last`` and ``compile``, applied to the outermost models
at their first forward (found by :class:`~torchdoctor.treat.child.RootWatch`).

* ``channels-last``: a root with Conv2d layers is converted once,
  ``model.to(memory_format=torch.channels_last)`` (parameters keep their identity: the
  optimizer still holds them; values and state_dict keys unchanged), and its 4-D tensor inputs
  are made channels-last at each call (not when ``compile`` runs in the same trial: the watch
  stops after the first step there, so that no torchdoctor hook is traced into the graph; the
  first convolution then converts). Converted back to contiguous on uninstall.
* ``compile``: ``model.compile(**options)`` — in place, ``torch.compile`` of the module's call
  (``state_dict`` keys unchanged, unlike ``torch.compile(model)``'s ``_orig_mod.`` prefix); the
  first forward runs eager, the next ones compiled. The steps in which dynamo or the backward
  compiled (torch's compile callbacks, ``torch_internals.compile_callbacks``) are recorded as
  ``compile_steps`` with the compile seconds, so that the parent leaves them out of the step
  time. Undone on uninstall (``_compiled_call_impl`` reset).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from torchdoctor.treat.child import Applier, user_site

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class ChannelsLast(Applier):
    name = "channels-last"

    def wants_roots(self, step: int, together: frozenset) -> bool:
        return step < 1 or "compile" not in together

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self.done: dict[int, Any] = {}  # id -> weakref of converted roots

    def on_root(self, ctx: Any, module: Any, args: tuple) -> tuple | None:
        torch = self.torch
        if id(module) not in self.done:
            if not any(isinstance(m, torch.nn.Conv2d) for m in module.modules()):
                self.done[id(module)] = None
                return None
            module.to(memory_format=torch.channels_last)
            self.done[id(module)] = weakref.ref(module)
            self.change("model", user_site(3),
                        "model = model.to(memory_format=torch.channels_last)   # once, after building it\n"
                        "x = x.to(memory_format=torch.channels_last)   # each 4-D input, before model(x)")
        if self.done.get(id(module)) is None:
            return None
        if not any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in args):
            return None
        return tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)

    def uninstall(self, ctx: Any) -> None:
        super().uninstall(ctx)
        for ref in getattr(self, "done", {}).values():
            m = ref() if ref is not None else None
            if m is not None:
                try:
                    m.to(memory_format=self.torch.contiguous_format)
                except Exception:  # noqa: BLE001
                    pass


class Compile(Applier):
    name = "compile"

    def wants_roots(self, step: int, together: frozenset) -> bool:
        return step < 1

    def install(self, ctx: Any) -> None:
        import torch

        from torchdoctor.torch_internals import compile_callbacks

        self.torch, self.ctx = torch, ctx
        v = (self.value or "default").strip()
        self.kwargs = ({} if v == "default" else {"mode": v}) if v in COMPILE_MODES else {"backend": v}
        self.compiled: list[Any] = []
        self.steps: set[int] = set()
        self.seconds = 0.0
        self.t0: float | None = None
        self.cb = compile_callbacks()
        if self.cb is not None:
            self.cb.add(self._start, self._end)
        else:
            self.note("this torch has no compile callbacks: the first two steps are left out instead")

    def _start(self, *_a: Any) -> None:
        self.t0 = time.perf_counter()
        self.steps.add(self.ctx.step + 1)

    def _end(self, *_a: Any) -> None:
        if self.t0 is not None:
            self.seconds += time.perf_counter() - self.t0
            self.t0 = None
        self.steps.add(self.ctx.step + 1)

    def on_root(self, ctx: Any, module: Any, args: tuple) -> tuple | None:
        if getattr(module, "_compiled_call_impl", None) is not None or any(
                r() is module for r in self.compiled):
            return None
        module.compile(**self.kwargs)
        self.compiled.append(weakref.ref(module))
        arg = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        self.change("model", user_site(3), f"model.compile({arg})   # once, after building it "
                                           "(in place: state_dict keys unchanged)")
        return None

    @property
    def extra(self) -> dict[str, Any]:
        steps = sorted(self.steps) if self.cb is not None else [1, 2]
        out = {"compile_steps": steps, "compile_s": round(self.seconds, 3)}
        from torchdoctor.instruments.dynamo._counts import dynamo_counts

        got = dynamo_counts()
        if got is not None:
            out["dynamo"] = got
        return out

    def uninstall(self, ctx: Any) -> None:
        super().uninstall(ctx)
        if self.cb is not None:
            self.cb.remove()
        for r in self.compiled:
            m = r()
            if m is not None:
                try:
                    m._compiled_call_impl = None
                except Exception:  # noqa: BLE001
                    pass


APPLIERS = {"channels-last": ChannelsLast, "compile": Compile}
