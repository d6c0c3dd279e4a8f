"""Optimizer treatments (child): ``fused-optimizer`` and ``set-to-none``.

* ``fused-optimizer``: the ``__init__`` of ``torch.optim.Adam``, ``AdamW`` and ``SGD`` is
  wrapped (the classes, undone on uninstall) to build them with ``fused=True`` (and ``foreach``
  unset: torch refuses both) when every parameter is a floating-point tensor on one device type
  that has a fused kernel; otherwise the optimizer is built as asked and the reason noted. A
  generator of parameters is read into a list first (the optimizer does the same).
* ``set-to-none``: ``Optimizer.zero_grad`` and ``Module.zero_grad`` called with
  ``set_to_none=False`` run with ``set_to_none=True`` (the default since torch 2.0): gradients
  become ``None`` instead of zero-filled tensors, which saves a memset per parameter and the
  memory between zero_grad and backward. A script that reads ``.grad`` after zero_grad sees
  ``None`` — that is the stated change, and such a trial fails with the script's error.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.treat.child import Applier, user_site

FUSED_CLASSES = ("Adam", "AdamW", "SGD")
FUSED_DEVICES = ("cuda", "cpu", "xpu", "mps")


class FusedOptimizer(Applier):
    name = "fused-optimizer"

    def install(self, ctx: Any) -> None:
        import torch

        inst = self
        for cname in FUSED_CLASSES:
            cls = getattr(torch.optim, cname, None)
            if cls is None or "__init__" not in vars(cls):
                continue

            def make(orig, cls=cls):
                def init(opt, params, *a, **k):
                    if inst.active() and type(opt) is cls and not k.get("fused"):
                        try:
                            params, k = inst._fuse(opt, params, k)
                        except Exception as e:  # noqa: BLE001 - built as the script asked
                            inst.note(f"{cls.__name__}: not fused ({type(e).__name__}: {e})")
                    return orig(opt, params, *a, **k)
                return init

            self.patches.wrap(cls, "__init__", make)

    def _fuse(self, opt: Any, params: Any, k: dict) -> tuple[Any, dict]:
        import torch

        from torchdoctor.instruments._sites import creation_site

        if isinstance(params, torch.Tensor):
            return params, k  # torch refuses a bare tensor: built as asked, it raises itself
        params = [dict(g, params=list(g["params"])) if isinstance(g, dict) and "params" in g else g
                  for g in params]
        tensors = [t[1] if isinstance(t, tuple) and len(t) == 2 else t
                   for g in params for t in (g["params"] if isinstance(g, dict) else [g])]
        devs = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
        cls = type(opt).__name__
        if len(devs) != 1 or not devs <= set(FUSED_DEVICES) or not all(
                isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
            self.note(f"{cls}: not fused (parameters on {sorted(devs) or 'no device'}, or not "
                      "all floating point)")
            return params, k
        k = {**k, "fused": True}
        if k.get("foreach"):
            k["foreach"] = None
        self.change("optimizer", creation_site(opt, 3), f"torch.optim.{cls}(..., fused=True)")
        return params, k


class SetToNone(Applier):
    name = "set-to-none"

    def install(self, ctx: Any) -> None:
        import torch

        inst = self

        def make(orig):
            def zero_grad(obj, *a, **k):
                if inst.active() and k.get("set_to_none", a[0] if a else True) is False:
                    a, k = (), {**k, "set_to_none": True}
                    inst.change("zero_grad", user_site(2), "zero_grad(set_to_none=True)   "
                                                           "# or zero_grad(): the default since torch 2.0")
                return orig(obj, *a, **k)
            return zero_grad

        self.patches.wrap(torch.optim.Optimizer, "zero_grad", make)
        self.patches.wrap(torch.nn.Module, "zero_grad", make)


APPLIERS = {"fused-optimizer": FusedOptimizer, "set-to-none": SetToNone}
