"""What the script built, for choosing trials (child side): the ``treat_survey`` event.

Recorded in every ``treat`` run (baseline and treated alike, so both carry the same cost):

* ``loaders``: each DataLoader built — the user's line, num_workers, pin_memory,
  persistent_workers, prefetch_factor, whether its dataset is iterable;
* ``rng_in_fetch``: the main process's RNG (torch, ``random``, NumPy) moved while a batch was
  fetched in the main process (not at an epoch start): the dataset draws random numbers in
  ``__getitem__``; in worker processes those come from per-worker seeds, so a data-side trial
  cannot be compared loss for loss;
* ``optimizers``: class, the user's line, fused/foreach, the parameters' device types;
* ``zero_grad``: the user's lines that call ``zero_grad(set_to_none=False)``;
* ``models``: the outermost models of the first ``WATCH_STEPS`` steps — class, Conv2d inside,
  parameter dtypes and device, channels-last already, compiled already, the forward's line,
  autocast active at the forward, whether the input shapes changed between steps;
* ``flags``: float32 matmul precision, TF32 and cuDNN flags after the first step;
  ``alloc_conf`` (PYTORCH_CUDA_ALLOC_CONF); ``device``: cuda capability and bf16 support;
* ``parallel`` (a rank of ``treat --nproc-per-node N`` only): DDP and ``fully_shard`` calls, the
  backend (:mod:`torchdoctor.treat.dist_survey`); an optimizer's ``dtensor``: its parameters are
  DTensors (FSDP2's shards).

Cost: one stack walk per DataLoader/optimizer built, a wrapper on ``zero_grad``, global
forward hooks and an RNG-state read per batch during the first ``WATCH_STEPS`` steps only.
"""

from __future__ import annotations

import os
import sys
from typing import Any

WATCH_STEPS = 3
MAX_ITEMS = 20


class Survey:
    def __init__(self) -> None:
        from torchdoctor.runner.patching import Patches

        self.patches = Patches()
        self.live = True
        self.pid = os.getpid()
        self.loaders: list[dict[str, Any]] = []
        self.optimizers: list[dict[str, Any]] = []
        self.opt_index: dict[int, int] = {}
        self.zero_grad: dict[str, bool] = {}
        self.models: dict[int, dict[str, Any]] = {}
        self.flags: dict[str, Any] = {}
        self.rng_snap: Any = None
        self.new_iter = False
        self.rng_moves = 0
        self.rng_looks = 0
        self.watch: Any = None
        self.watch_steps = WATCH_STEPS  # 1 in a compile trial: no hook of ours traced by dynamo
        self.dist: Any = None  # a DistSurvey on a rank of a torchrun launch

    def _mine(self) -> bool:
        return self.live and os.getpid() == self.pid

    def install(self, ctx: Any) -> None:
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        from torchdoctor.instruments._sites import call_site, creation_site
        from torchdoctor.torch_internals import base_loader_iter
        from torchdoctor.treat.child import RootWatch

        self.ctx, self.torch = ctx, torch
        s = self

        def dl_init(orig):
            def init(loader, *a, **k):
                orig(loader, *a, **k)
                if s._mine() and len(s.loaders) < MAX_ITEMS:
                    try:
                        s.loaders.append({
                            "site": creation_site(loader, 2), "num_workers": loader.num_workers,
                            "pin_memory": bool(loader.pin_memory),
                            "persistent_workers": bool(loader.persistent_workers),
                            "prefetch_factor": loader.prefetch_factor,
                            "iterable": isinstance(loader.dataset, IterableDataset),
                            "dataset": type(loader.dataset).__name__})
                    except Exception:  # noqa: BLE001 - never break the user's script
                        pass
            return init

        def it_init(orig):
            def init(it, *a, **k):
                orig(it, *a, **k)
                s.new_iter = True
            return init

        def opt_init(orig):
            def init(opt, *a, **k):
                orig(opt, *a, **k)
                if s._mine() and id(opt) not in s.opt_index and len(s.optimizers) < MAX_ITEMS:
                    try:
                        ps = [p for g in opt.param_groups for p in g["params"]]
                        devs = sorted({p.device.type for p in ps})
                        s.opt_index[id(opt)] = len(s.optimizers)
                        row = {"cls": type(opt).__name__, "module": type(opt).__module__,
                               "site": creation_site(opt, 2), "fused": opt.defaults.get("fused"),
                               "foreach": opt.defaults.get("foreach"), "devices": devs}
                        if s.dist is not None:
                            from torchdoctor.torch_internals import is_dtensor

                            row["dtensor"] = any(is_dtensor(p) for p in ps)
                        s.optimizers.append(row)
                    except Exception:  # noqa: BLE001
                        pass
            return init

        def zg(orig):
            def zero_grad(obj, *a, **k):
                if s._mine() and len(s.zero_grad) < MAX_ITEMS:
                    try:
                        stn = k.get("set_to_none", a[0] if a else True)
                        site = call_site(2)
                        if site is not None:
                            s.zero_grad[site] = bool(stn)
                    except Exception:  # noqa: BLE001
                        pass
                return orig(obj, *a, **k)
            return zero_grad

        P = self.patches
        P.wrap(DataLoader, "__init__", dl_init)
        P.wrap(base_loader_iter(), "__init__", it_init)
        P.wrap(torch.optim.Optimizer, "__init__", opt_init)
        P.wrap(torch.optim.Optimizer, "zero_grad", zg)
        P.wrap(torch.nn.Module, "zero_grad", zg)
        self.watch = RootWatch(ctx, self._on_root)
        from torchdoctor.treat.dist_survey import DistSurvey, ranked

        if ranked():
            self.dist = DistSurvey(P, self._mine)
            self.dist.install()

    # -- models -----------------------------------------------------------------------------------
    def _on_root(self, module: Any, args: tuple) -> None:
        if not self._mine():
            return None
        torch = self.torch
        rec = self.models.get(id(module))
        shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)][:4]
        if rec is not None:
            if rec["shapes"] != shapes:
                rec["shapes_vary"] = True
            return None
        if len(self.models) >= MAX_ITEMS:
            return None
        from torchdoctor.instruments._sites import call_site

        try:
            convs = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
            params = list(module.parameters())
            dev = params[0].device.type if params else "cpu"
            w = convs[0].weight if convs else None
            self.models[id(module)] = {
                "cls": type(module).__name__, "has_conv": bool(convs),
                "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
                "device": dev, "forward_site": call_site(3),
                "channels_last": bool(w is not None and w.dim() == 4 and not w.is_contiguous()
                                      and w.is_contiguous(memory_format=torch.channels_last)),
                "compiled": getattr(module, "_compiled_call_impl", None) is not None
                or type(module).__name__ == "OptimizedModule",
                "autocast": bool(torch.is_autocast_enabled(dev)) if dev in ("cuda", "cpu") else False,
                "shapes": shapes, "shapes_vary": False}
        except Exception:  # noqa: BLE001
            pass
        return None

    # -- RNG draws while fetching a batch in the main process ------------------------------------
    def _rng_state(self) -> Any:
        import random

        st: list[Any] = [self.torch.get_rng_state(), random.getstate()]
        np = sys.modules.get("numpy")
        if np is not None:
            try:
                g = np.random.get_state()
                st.append((g[2], g[3], int(g[1][0]), int(g[1][-1])))
            except Exception:  # noqa: BLE001
                pass
        return st

    def on_batch(self, ctx: Any) -> None:
        if self.rng_snap is None or ctx.step > WATCH_STEPS + 2:
            return
        snap, self.rng_snap = self.rng_snap, None
        if self.new_iter:  # an epoch began: the sampler and the base seed draw from the RNG
            return
        now = self._rng_state()
        self.rng_looks += 1
        if not (self.torch.equal(now[0], snap[0]) and now[1:] == snap[1:]):
            self.rng_moves += 1

    def on_step_end(self, ctx: Any, step: int) -> None:
        torch = self.torch
        if step == 1:
            self.flags = _flags(torch)
            if self.dist is not None:
                self.dist.snapshot()
        if step >= self.watch_steps and self.watch is not None:
            self.watch.stop()
            self.watch = None
        if step <= WATCH_STEPS + 1:
            self.new_iter = False
            self.rng_snap = self._rng_state()
        else:
            self.rng_snap = None

    def uninstall(self, ctx: Any) -> None:
        self.live = False
        if self.watch is not None:
            self.watch.stop()
        self.patches.undo()

    def record(self) -> dict[str, Any]:
        torch = self.torch
        dev: dict[str, Any] = {"cuda": False}
        try:
            if torch.cuda.is_available():
                i = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
                dev = {"cuda": True, "capability": list(torch.cuda.get_device_capability(i)),
                       "bf16": bool(torch.cuda.is_bf16_supported()),
                       "name": torch.cuda.get_device_name(i)}
        except Exception:  # noqa: BLE001
            pass
        return {"loaders": self.loaders, "optimizers": self.optimizers,
                "zero_grad_false": sorted(k for k, v in self.zero_grad.items() if not v),
                "models": [{k: v for k, v in m.items() if k != "shapes"} for m in self.models.values()],
                "flags": self.flags or _flags(torch), "device": dev,
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                **({"parallel": self.dist.record()} if self.dist is not None else {}),
                "rng_in_fetch": self.rng_moves >= 2 or (self.rng_looks == 1 and self.rng_moves == 1),
                "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count()}


def _flags(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, read in (("float32_matmul_precision", lambda: torch.get_float32_matmul_precision()),
                      ("matmul_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                      ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                      ("cudnn_benchmark", lambda: torch.backends.cudnn.benchmark)):
        try:
            out[key] = read()
        except Exception:  # noqa: BLE001 - mixed TF32 APIs raise on read in some versions
            out[key] = None
    return out
