"""Data-parallel treatments (child, on every rank of ``treat --nproc-per-node N``):
``ddp-bucket-cap``, ``fsdp-bf16`` and ``compile-blocks``.

Applied like the one-process treatments, at construction, never in the user's file:

* ``ddp-bucket-cap``: ``DistributedDataParallel.__init__`` (the class, undone on uninstall)
  builds DDP with ``bucket_cap_mb`` = the value, or 4x the script's own (25 MiB when it passes
  none): fewer, larger gradient buckets, so fewer all-reduces a step, each nearer bus bandwidth.
  A script whose own buckets are already that large is left alone (noted).
* ``fsdp-bf16``: ``fully_shard`` (wherever the script can import it from:
  :data:`FULLY_SHARD_HOMES`) is called with ``mp_policy=MixedPrecisionPolicy(param_dtype=
  torch.bfloat16, reduce_dtype=torch.float32)`` when the script's call sets no ``param_dtype``
  (its other policy fields kept): bf16 all-gathers and compute, gradients reduced in float32.
* ``compile-blocks``: at the root's first forward, ``block.compile()`` of every FSDP2 unit below
  the root (the ``fully_shard``-ed blocks), in place, as ``compile`` does for a whole model; the
  steps in which torch compiled are recorded (``compile_steps``) and left out of the step time.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from typing import Any

from torchdoctor.treat.catalogue import BUCKET_FACTOR, DDP_DEFAULT_MB
from torchdoctor.treat.child import Applier, user_site
from torchdoctor.treat.model import Compile
# the modules a script imports fully_shard from (torch >= 2.6; the _composable path is older)
FULLY_SHARD_HOMES = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                     "torch.distributed.fsdp._fully_shard._fully_shard",
                     "torch.distributed._composable.fsdp")


def wrap_fully_shard(patches: Any, make: Any) -> int:
    """Wrap ``fully_shard`` in every home that holds torch's function (one wrapper for all of
    them: ``make(orig)``); returns how many homes were patched (0: no FSDP2 in this torch)."""
    import importlib

    try:
        importlib.import_module("torch.distributed.fsdp")
    except Exception:  # noqa: BLE001 - a torch without FSDP2
        return 0
    orig = getattr(sys.modules["torch.distributed.fsdp"], "fully_shard", None)
    if not callable(orig):
        return 0
    wrapper = make(orig)
    n = 0
    for name in FULLY_SHARD_HOMES:
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - an older or newer torch: that home is absent
                continue
        if getattr(mod, "fully_shard", None) is orig:
            patches.set(mod, "fully_shard", wrapper, orig)
            n += 1
    return n


def ddp_bucket_mb(bound: Any) -> float:
    """The bucket_cap_mb a DDP construction asked for (torch's default when none)."""
    v = bound.arguments.get("bucket_cap_mb")
    return float(v) if v is not None else DDP_DEFAULT_MB


class DdpBucketCap(Applier):
    name = "ddp-bucket-cap"

    def install(self, ctx: Any) -> None:
        import inspect

        from torch.nn.parallel import DistributedDataParallel as DDP

        inst = self
        sig = inspect.signature(DDP.__init__)

        def make(orig):
            def init(ddp, *a, **k):
                try:
                    bound = sig.bind(ddp, *a, **k) if inst.active() else None
                except TypeError:  # the script's own wrong call: torch raises its own error
                    bound = None
                if bound is not None:
                    mine = ddp_bucket_mb(bound)
                    want = float(inst.value) if inst.value else mine * BUCKET_FACTOR
                    if bound.arguments.get("bucket_cap_mb_list"):
                        inst.note("DistributedDataParallel: bucket_cap_mb_list set by the script: left alone")
                    elif want <= mine:
                        inst.note(f"DistributedDataParallel: bucket_cap_mb={mine:g} already >= {want:g}")
                    else:
                        bound.arguments["bucket_cap_mb"] = want
                        from torchdoctor.instruments._sites import creation_site

                        inst.change("DistributedDataParallel", creation_site(ddp, 2),
                                    f"DistributedDataParallel(..., bucket_cap_mb={want:g})")
                        return orig(*bound.args, **bound.kwargs)
                return orig(ddp, *a, **k)
            return init

        self.patches.wrap(DDP, "__init__", make)


class FsdpBf16(Applier):
    name = "fsdp-bf16"

    def install(self, ctx: Any) -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy

        inst = self

        def make(orig):
            @functools.wraps(orig)
            def fully_shard(module, *a, **k):
                if inst.active():
                    mp = k.get("mp_policy") or MixedPrecisionPolicy()
                    if mp.param_dtype is None:
                        k = {**k, "mp_policy": dataclasses.replace(
                            mp, param_dtype=torch.bfloat16, reduce_dtype=mp.reduce_dtype or torch.float32)}
                        inst.change("fully_shard", user_site(2),
                                    "fully_shard(block, ..., mp_policy=MixedPrecisionPolicy("
                                    "param_dtype=torch.bfloat16, reduce_dtype=torch.float32))   "
                                    "# every fully_shard call, the root's too")
                    else:
                        inst.note(f"fully_shard: param_dtype={mp.param_dtype} set by the script: left alone")
                return orig(module, *a, **k)
            return fully_shard

        if not wrap_fully_shard(self.patches, make):
            raise RuntimeError("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)")


class CompileBlocks(Compile):
    """``compile`` per FSDP2 unit below the root (the compile callbacks and steps: :class:`Compile`)."""

    name = "compile-blocks"

    def install(self, ctx: Any) -> None:
        super().install(ctx)
        self.roots: list[Any] = []

    def on_root(self, ctx: Any, module: Any, args: tuple) -> tuple | None:
        from torch.distributed.fsdp import FSDPModule

        if any(r() is module for r in self.roots):
            return None
        self.roots.append(weakref.ref(module))
        blocks = [m for m in module.modules() if m is not module and isinstance(m, FSDPModule)
                  and getattr(m, "_compiled_call_impl", None) is None]
        if not blocks:
            self.note(f"{type(module).__name__}: no fully_shard unit below the root")
            return None
        for m in blocks:
            m.compile(**self.kwargs)
            self.compiled.append(weakref.ref(m))
        arg = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        self.change("model", user_site(3),
                    f"block.compile({arg})   # each fully_shard-ed block ({len(blocks)} here), in place")
        return None


APPLIERS = {"ddp-bucket-cap": DdpBucketCap, "fsdp-bf16": FsdpBf16, "compile-blocks": CompileBlocks}
