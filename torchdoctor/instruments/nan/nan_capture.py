"""The re-run that names the op: exact stats and the first non-finite op of one module call.

Idle unless the option ``nan_capture`` is set, which only the ``nan`` follow-up does after the
first run located the first non-finite value (``nonfinite`` event). The script runs again,
with the same arguments, to that step; there:

* ``what == "call"``: at the module call the first run named (the same module path under a
  root of the same class, the same n-th call of that module in the window), the inputs' exact
  stats and the user's call site are taken, and the call runs under
  :func:`torchdoctor.numerics.checkmode.make_mode`, which names the first aten op whose output
  is non-finite while its inputs are finite, with the user's line;
* ``what == "loss"``: the code between the last root module's forward and ``backward`` (the
  loss computation) runs under the same mode;
* ``what == "step"`` (the first run did not watch module outputs): the whole forward of the
  step and the loss code, from the first root module call to ``backward``, run under the mode,
  which also notes the module running at the op.

Then the run stops. A script that is not deterministic may not reproduce the value at that
call; the event says so (``reproduced``: false) and the first run's evidence stands alone.

Event: ``nan_capture`` {step, what, reproduced, module, call_site, code, inputs, outputs, op}.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register


@register
class NanCapture(Instrument):
    name = "nan_capture"
    produces = frozenset({"nan_capture"})
    priority = 61

    def install(self, ctx: Any) -> None:
        spec = ctx.options.get("nan_capture")
        self.active = bool(spec)
        if not self.active:
            return
        import torch
        from torch.nn.modules import module as mod_mod
        from torch.optim import optimizer as optim_mod

        self.torch = torch
        self.ctx = ctx
        self.spec = dict(spec)
        self.step = int(spec["step"])
        self.what = spec.get("what", "call")
        self.target = spec.get("target") or {}
        self.pid = os.getpid()
        self.counts: dict[int, int] = {}
        self.depth = 0
        self.call: tuple[Any, int] | None = None
        self.mode = None
        self.done = False
        self.namer = None
        self.pre_steps = 0
        self.inputs: list = []
        self.running: list = []  # module call stack ("step" capture)
        self.call_site: list[str] = []
        self.handles = [mod_mod.register_module_forward_pre_hook(self._pre),
                        mod_mod.register_module_forward_hook(self._post, always_call=True),
                        optim_mod.register_optimizer_step_pre_hook(self._opt_pre)]

    def uninstall(self, ctx: Any) -> None:
        if not self.active:
            return
        for h in self.handles:
            h.remove()
        self._exit_mode()
        if not self.done:
            ctx.emit("nan_capture", step=self.step, what=self.what, reproduced=False,
                     reason="the run did not reach that call with a non-finite value")

    # ------------------------------------------------------------------ helpers
    def _here(self) -> bool:
        return (not self.done and self.ctx.step + 1 == self.step and self.ctx.in_owner_thread())

    def _enter_mode(self) -> None:
        if self.mode is None:
            from torchdoctor.numerics.checkmode import make_mode

            self.mode = make_mode()
            self.mode.__enter__()

    def _exit_mode(self):
        m = self.mode
        if m is not None:
            self.mode = None
            try:
                m.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass
        return m

    def _path(self, m: Any) -> tuple[str, str] | None:
        from torchdoctor.numerics.names import Namer

        if self.namer is None or id(m) not in self.namer.rel:
            self.namer = Namer(self.ctx.models(), labels=False)
        return self.namer.rel.get(id(m))

    def _finish(self, **ev: Any) -> None:
        self.done = True
        self.ctx.emit("nan_capture", step=self.step, what=self.what, **ev)
        self.ctx.request_stop("nan capture done")

    # ------------------------------------------------------------------ hooks
    def _opt_pre(self, opt, args, kwargs):
        try:
            if not self.ctx.in_owner_thread():
                return None
            self.counts.clear()  # ordinals count calls per window, as the monitor's do
            self.pre_steps += 1
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_opt_pre")
        return None

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.active:
            return
        if self.pre_steps == 0:
            self.counts.clear()
        self.pre_steps = 0

    def _pre(self, module, args):
        try:
            if not self._here():
                return None
            if self.what == "loss" and self.depth == 0:
                self._exit_mode()  # a root module starts: the loss code did not end in backward yet
            self.depth += 1
            if self.what == "step":
                self.running.append(module)
                if self.mode is None:
                    self._enter_mode()
                    self.mode.module_of = self._running_name
                return None
            if self.what != "call" or self.call is not None:
                return None
            n = self.counts.get(id(module), 0)
            self.counts[id(module)] = n + 1
            t = self.target
            if type(module).__name__ != t.get("module_class") or n != t.get("ordinal"):
                return None
            rel = self._path(module)
            if rel is None or rel[1] != t.get("path") or rel[0] != t.get("root_class"):
                return None
            from torchdoctor.numerics.names import user_stack
            from torchdoctor.numerics.tensors import exact_stats, float_tensors

            self.inputs = [exact_stats(x) for x in float_tensors(args)[:4]]
            self.call_site = user_stack(limit=4, skip=2)
            self.call = (module, self.depth)
            self._enter_mode()
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_pre")
        return None

    def _post(self, module, args, output):
        try:
            if not self._here():
                return None
            if self.what == "step":
                if self.running and self.running[-1] is module:
                    self.running.pop()
                self.depth = max(0, self.depth - 1)
                return None
            if self.call is not None and module is self.call[0] and self.depth == self.call[1]:
                mode = self._exit_mode()
                from torchdoctor.numerics.names import source_line
                from torchdoctor.numerics.tensors import exact_stats, float_tensors

                outs = [exact_stats(x) for x in float_tensors(output)[:4]] if output is not None else []
                bad = any(o["nan"] or o["inf"] or o["-inf"] for o in outs)
                site = self.call_site[0] if self.call_site else None
                self.call = None
                self._finish(reproduced=bad, call_site=self.call_site, code=source_line(site) if site else None,
                             inputs=self.inputs, outputs=outs,
                             op=mode.found if mode is not None else None,
                             ops_checked=mode.ops_checked if mode is not None else 0)
            self.depth = max(0, self.depth - 1)
            if self.what == "loss" and self.depth == 0 and not self.done:
                self._enter_mode()
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_post")
        return None

    def _running_name(self) -> str | None:
        if not self.running:
            return None
        from torchdoctor.numerics.names import Namer

        m = self.running[-1]
        return f"{Namer(self.ctx.models()).module(m)} ({type(m).__name__})"

    def on_backward_begin(self, ctx: Any) -> None:
        if not self.active or self.what not in ("loss", "step") or not self._here():
            return
        mode = self._exit_mode()
        if mode is None:
            return
        found = mode.found
        if found is None and mode.ops_checked == 0:
            return
        self._finish(reproduced=found is not None, op=found, ops_checked=mode.ops_checked)
