"""Training-loop settings that silently change what training does: modules left in eval mode,
float16 without loss scaling, loss inputs that broadcast.

All Python-side, no device sync:

* **eval mode** (``eval-mode-training``): at each backward's start (the forward that made the
  loss has just run), the Dropout (p > 0) and BatchNorm/InstanceNorm (running stats) modules of
  every root model that are in eval mode are listed; the optimizer pre-step then keeps the ones
  whose effect is trained: a norm layer whose own affine parameters require grad, or a module
  whose parent holds parameters that require grad. A frozen backbone (``requires_grad_(False)``)
  in eval mode is therefore not reported; a teacher model nobody optimizes neither.
  ``Module.train`` is wrapped to note the user's line of each outermost ``train(False)`` /
  ``eval()`` call (kept aside, never on the module): the report names the ``model.eval()``
  that left the trained modules in eval mode (``eval_at``).
* **float16 without a GradScaler** (``fp16-without-scaler``): ``autocast.__enter__`` is
  wrapped to note float16 regions; ``GradScaler.scale`` to note an *enabled* scaler scaling the
  loss. A backward that follows a float16 autocast region (or steps float16 parameters) with no
  scaled loss is counted.
* **loss inputs that broadcast** (``loss-shape-broadcast``): ``F.mse_loss``, ``l1_loss``,
  ``smooth_l1_loss`` and ``huber_loss`` (the losses for which PyTorch itself warns "Using a
  target size ... that is different to the input size") are wrapped to record differing shapes
  and the user's call site, even when warnings are filtered.

Events: ``eval_mode`` {step, modules, count, optimizer, eval_at} (first occurrence) and
``eval_mode_summary``; ``amp`` {fp16_backwards, unscaled_fp16_backwards, scaled_backwards,
bf16_backwards, first_unscaled_step, devices, fp16_params}; ``loss_shape`` {fn, input_shape,
target_shape, result_shape, where, code, step, count}.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.runner.patching import Patches

LOSS_FNS = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
MAX_NAMES = 12


@register
class TrainingModes(Instrument):
    name = "training_modes"
    produces = frozenset({"amp", "eval_mode", "eval_mode_summary", "loss_shape", "loss_watch"})
    priority = 56

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self.ctx = ctx
        self.pid = os.getpid()
        self._undo = Patches()  # undone only where our wrapper is still on top
        # eval mode
        self.mode_cache: dict[int, list] = {}  # id(root) -> [(name, module, parent)]
        self.eval_now: list = []  # [(name, module, parent)] at the latest backward start
        self.eval_first: dict | None = None
        self.eval_steps = 0
        self.eval_judged = 0
        self.mode_calls: dict[int, tuple] = {}  # id(module) -> (weakref, mode, site, seq)
        self.mode_seq = 0
        self.in_train = False
        self._patch_train(torch)
        # amp
        self.fp16_since_bwd = False
        self.bf16_since_bwd = False
        self.scaled_since_bwd = False
        self.fp16_bwd = self.unscaled = self.scaled_bwd = self.bf16_bwd = 0
        self.first_unscaled: int | None = None
        self.amp_devices: set[str] = set()
        self.fp16_params = False
        self.scaler_seen = False
        self.scaler_disabled = False
        self.last_bwd_scaled = False
        self._patch_amp(torch)
        # loss shapes
        self.loss_shapes: dict[tuple, dict] = {}
        self.loss_calls = 0
        self._patch_losses(torch)
        from torch.optim import optimizer as optim_mod

        self.handles = [optim_mod.register_optimizer_step_pre_hook(self._pre_step)]

    live = True  # False once uninstalled

    def uninstall(self, ctx: Any) -> None:
        self.live = False
        for h in self.handles:
            h.remove()
        self._undo.undo()
        ctx.emit("eval_mode_summary", judged_steps=self.eval_judged, eval_steps=self.eval_steps,
                 first=self.eval_first,
                 mode_modules=sum(len(v) for v in self.mode_cache.values()))
        ctx.emit("amp", fp16_backwards=self.fp16_bwd, unscaled_fp16_backwards=self.unscaled,
                 scaled_backwards=self.scaled_bwd, bf16_backwards=self.bf16_bwd,
                 first_unscaled_step=self.first_unscaled, devices=sorted(self.amp_devices),
                 fp16_params=self.fp16_params, scaler_seen=self.scaler_seen,
                 scaler_disabled=self.scaler_disabled)
        for rec in self.loss_shapes.values():
            ctx.emit("loss_shape", **rec)
        ctx.emit("loss_watch", calls=self.loss_calls, functions=[f"F.{f}" for f in LOSS_FNS])

    # ------------------------------------------------------------------ amp
    def _patch_amp(self, torch) -> None:
        from torch.amp import autocast_mode, grad_scaler

        inst = self
        AC = autocast_mode.autocast
        orig_enter = AC.__enter__

        def enter(ac, *a, **k):
            r = orig_enter(ac, *a, **k)
            try:
                if getattr(ac, "_enabled", False) and inst.ctx.in_owner_thread():
                    dt = getattr(ac, "fast_dtype", None)
                    if dt == torch.float16:
                        inst.fp16_since_bwd = True
                        inst.amp_devices.add(str(getattr(ac, "device", "?")))
                    elif dt == torch.bfloat16:
                        inst.bf16_since_bwd = True
            except Exception:  # noqa: BLE001
                pass
            return r

        self._undo.set(AC, "__enter__", enter, orig_enter)

        GS = grad_scaler.GradScaler
        orig_scale = GS.scale

        def scale(gs, outputs, *a, **k):
            try:
                if inst.ctx.in_owner_thread():
                    inst.scaler_seen = True
                    if gs.is_enabled():
                        inst.scaled_since_bwd = True
                    else:
                        inst.scaler_disabled = True
            except Exception:  # noqa: BLE001
                pass
            return orig_scale(gs, outputs, *a, **k)

        self._undo.set(GS, "scale", scale, orig_scale)

    # ------------------------------------------------------------------ loss shapes
    def _patch_losses(self, torch) -> None:
        import torch.nn.functional as F

        inst = self
        for fname in LOSS_FNS:
            orig = getattr(F, fname, None)
            if orig is None:
                continue

            def make(orig, fname):
                def wrapped(input, target, *a, **k):
                    inst.loss_calls += 1
                    try:
                        if (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
                                and input.shape != target.shape and inst.ctx.in_owner_thread()):
                            inst._loss_shape(fname, input, target)
                    except Exception:  # noqa: BLE001
                        pass
                    return orig(input, target, *a, **k)

                wrapped.__wrapped__ = orig
                wrapped.__name__ = fname
                wrapped.__doc__ = orig.__doc__
                return wrapped

            self._undo.set(F, fname, make(orig, fname), orig)

    def _loss_shape(self, fname: str, input, target) -> None:
        from torchdoctor.numerics.names import source_line, user_stack

        key = (fname, tuple(input.shape), tuple(target.shape))
        rec = self.loss_shapes.get(key)
        if rec is not None:
            rec["count"] += 1
            return
        stack = user_stack(limit=3, skip=3)
        try:
            result = list(self.torch.broadcast_shapes(input.shape, target.shape))
        except RuntimeError:
            result = None
        self.loss_shapes[key] = {
            "fn": f"F.{fname}", "input_shape": list(input.shape), "target_shape": list(target.shape),
            "result_shape": result, "where": stack[0] if stack else None,
            "code": source_line(stack[0]) if stack else None, "step": self.ctx.step + 1,
            "grad": bool(input.requires_grad or target.requires_grad), "count": 1}

    # ------------------------------------------------------------------ eval mode
    def _patch_train(self, torch) -> None:
        import weakref

        from torchdoctor.instruments._sites import call_site

        inst = self
        Mod = torch.nn.Module
        orig = Mod.train

        def train(mod, mode=True):
            if inst.in_train or not inst.live or os.getpid() != inst.pid:
                return orig(mod, mode)
            inst.in_train = True  # children's train() calls are part of this one
            try:
                return orig(mod, mode)
            finally:
                inst.in_train = False
                try:
                    inst.mode_seq += 1
                    inst.mode_calls[id(mod)] = (weakref.ref(mod), bool(mode),
                                                None if mode else call_site(2), inst.mode_seq)
                except Exception:  # noqa: BLE001 - a site is a nicety, never a failure
                    pass

        self._undo.set(Mod, "train", train, orig)

    def _eval_site(self, module) -> str | None:
        """The user's line of the latest ``train(False)`` that covers ``module``, if it still holds."""
        best = None
        for ref, mode, site, seq in list(self.mode_calls.values()):
            m = ref()
            if m is None or (best is not None and seq <= best[0]):
                continue
            if m is module or any(c is module for c in m.modules()):
                best = (seq, mode, site)
        return best[2] if best and not best[1] else None

    def _mode_modules(self, root) -> list:
        cached = self.mode_cache.get(id(root))
        if cached is not None:
            return cached
        nn = self.torch.nn
        kinds = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm,
                 nn.modules.instancenorm._InstanceNorm)
        out = []
        parents: dict[int, Any] = {}
        for name, m in root.named_modules():
            for c in m.children():
                parents.setdefault(id(c), m)
            if isinstance(m, kinds):
                if isinstance(m, nn.modules.dropout._DropoutNd) and not getattr(m, "p", 0):
                    continue
                if (isinstance(m, nn.modules.instancenorm._InstanceNorm)
                        and not m.track_running_stats):
                    continue
                out.append((name, m, parents.get(id(m))))
        self.mode_cache[id(root)] = out
        return out

    def on_backward_begin(self, ctx: Any) -> None:
        # amp bookkeeping for this backward
        if self.fp16_since_bwd:
            self.fp16_bwd += 1
            if not self.scaled_since_bwd:
                self.unscaled += 1
                if self.first_unscaled is None:
                    self.first_unscaled = ctx.step + 1
        elif self.bf16_since_bwd:
            self.bf16_bwd += 1
        if self.scaled_since_bwd:
            self.scaled_bwd += 1
        self.last_bwd_scaled = self.scaled_since_bwd
        self.fp16_since_bwd = self.bf16_since_bwd = self.scaled_since_bwd = False
        # modes of the roots' Dropout/BatchNorm modules as the forward ran
        now = []
        for root in ctx.models():
            for name, m, parent in self._mode_modules(root):
                if not m.training:
                    now.append((root, name, m, parent))
        self.eval_now = now

    def _pre_step(self, opt, args, kwargs):
        try:
            if not self.ctx.in_owner_thread():
                return None
            ctx = self.ctx
            torch = self.torch
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            if not self.fp16_params:
                for g in opt.param_groups:
                    for p in g["params"]:
                        if p.dtype == torch.float16 and p.grad is not None:
                            self.fp16_params = True
                            if not self.last_bwd_scaled and self.first_unscaled is None:
                                self.first_unscaled = ctx.step + 1
                            break
            self.eval_judged += 1
            hits = []
            for root, name, m, parent in self.eval_now:
                if not any(id(p) in ids for p in root.parameters()):
                    continue
                own = [p for p in m.parameters(recurse=False) if p.requires_grad]
                around = parent is not None and any(p.requires_grad and id(p) in ids
                                                    for p in parent.parameters())
                if own or around:
                    hits.append((root, name, m))
            if hits:
                self.eval_steps += 1
                if self.eval_first is None:
                    from torchdoctor.numerics.names import Namer

                    namer = Namer(ctx.models())
                    self.eval_first = {
                        "step": ctx.step + 1, "count": len(hits),
                        "modules": [f"{namer.module(m)} ({type(m).__name__})" for _r, _n, m in hits[:MAX_NAMES]],
                        "roots_training_flag": {namer.module(r): bool(r.training)
                                                for r in {id(h[0]): h[0] for h in hits}.values()},
                        "eval_at": self._eval_site(hits[0][2])}
                    ctx.emit("eval_mode", **self.eval_first)
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_pre_step")
        return None
