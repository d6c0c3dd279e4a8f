"""Precision treatments (child): ``tf32`` and ``bf16-autocast``.

* ``tf32``: ``torch.set_float32_matmul_precision("high")`` and ``torch.backends.cudnn.allow_tf32
  = True`` before the script runs; both restored on uninstall. A script that sets the precision
  itself later wins (noted after the first step).
* ``bf16-autocast``: from the first forward of an outermost model on, everything except
  ``backward`` and ``optimizer.step()`` runs under ``torch.autocast(device, torch.bfloat16)``:
  entered at that forward, left when a backward begins (re-entered when it ends) and around
  each optimizer step (global optimizer step pre/post hooks). So the forward and the loss of
  every micro-batch are under autocast, the backward and the update are not — the placement the
  autocast docs recommend. Only matmul-type ops change (autocast's lower-precision list); its
  float32 list (softmax, norms, losses) keeps float32 inputs in float32. Left on uninstall.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.treat.child import Applier, user_site


class Tf32(Applier):
    name = "tf32"

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self.saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
        self.change("flag", None, "torch.backends.cuda.matmul.allow_tf32 = True\n"
                                  "torch.backends.cudnn.allow_tf32 = True")

    def on_step_end(self, ctx: Any, step: int) -> None:
        if step == 1:
            try:
                now = self.torch.get_float32_matmul_precision()
            except Exception:  # noqa: BLE001 - mixed TF32 APIs: the script set its own
                now = "set by the script"
            if now != "high":
                self.overridden(f"the script sets the float32 matmul precision itself ({now}) "
                                "after the treatment set it: the run did not measure it")

    def uninstall(self, ctx: Any) -> None:
        super().uninstall(ctx)
        try:
            self.torch.set_float32_matmul_precision(self.saved[0])
            self.torch.backends.cudnn.allow_tf32 = self.saved[1]
        except Exception:  # noqa: BLE001
            pass


class Bf16Autocast(Applier):
    name = "bf16-autocast"

    def wants_roots(self, step: int, together: frozenset) -> bool:
        return self.ac is None  # until the first forward entered autocast

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self.torch = torch
        self.ctx = ctx
        self.ac: Any = None  # the autocast context, once the first forward was seen
        self.inside = False
        self.device = "cpu"
        self.handles = [register_optimizer_step_pre_hook(self._opt_pre),
                        register_optimizer_step_post_hook(self._opt_post)]

    def _enter(self) -> None:
        if self.ac is not None and not self.inside and self.active():
            self.ac.__enter__()
            self.inside = True

    def _exit(self) -> None:
        if self.inside:
            self.inside = False
            self.ac.__exit__(None, None, None)

    def on_root(self, ctx: Any, module: Any, args: tuple) -> tuple | None:
        if self.ac is None:
            torch = self.torch
            p = next(module.parameters(), None)
            self.device = p.device.type if p is not None else "cpu"
            if self.device not in ("cuda", "cpu"):
                self.note(f"no bf16 autocast for device {self.device}")
                self.live = False
                return None
            self.ac = torch.autocast(device_type=self.device, dtype=torch.bfloat16)
            self.change("forward", user_site(3),
                        f"with torch.autocast({self.device!r}, dtype=torch.bfloat16):\n"
                        "    output = model(...)   # the forward\n"
                        "    loss = criterion(output, ...)   # and the loss\n"
                        "loss.backward()   # outside autocast")
        self._enter()
        return None

    def on_backward_begin(self, ctx: Any) -> None:
        if ctx.in_owner_thread():
            self._exit()

    def on_backward_end(self, ctx: Any) -> None:
        if ctx.in_owner_thread():
            self._enter()

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.ctx.in_owner_thread():
                self._exit()
        except Exception as e:  # noqa: BLE001 - never into the user's optimizer step
            self._broken(e)

    def _opt_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.ctx.in_owner_thread():
                self._enter()
        except Exception as e:  # noqa: BLE001
            self._broken(e)

    def _broken(self, e: BaseException) -> None:
        self.live = False
        self.inside = False
        self.ctx.emit("treatment_error", name=self.name, error=f"{type(e).__name__}: {e}"[:500],
                      where="optimizer step")

    def uninstall(self, ctx: Any) -> None:
        for h in getattr(self, "handles", []):
            h.remove()
        try:
            self._exit()
        except Exception:  # noqa: BLE001
            pass
        super().uninstall(ctx)


APPLIERS = {"tf32": Tf32, "bf16-autocast": Bf16Autocast}
