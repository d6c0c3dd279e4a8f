"""What a rank built for data parallelism (child side): the survey's ``parallel`` record.

Installed by :class:`~torchdoctor.treat.survey.Survey` only in a process launched by torchrun
(``WORLD_SIZE`` set), so a one-process treat run imports nothing of ``torch.distributed``:

* ``ddp``: each ``DistributedDataParallel`` built — the user's line, ``bucket_cap_mb`` (torch's
  25 when unset), whether ``bucket_cap_mb_list`` was given, the bytes of its trainable
  parameters, their device type;
* ``fsdp2``: each ``fully_shard`` call — the user's line, the module's class, the policy's
  ``param_dtype`` / ``reduce_dtype`` (None: unset), the parameters' dtypes before sharding;
* ``backend`` (``gloo``, ``nccl``, …) and ``world_size`` once the process group exists.

Cost: a wrapper on ``DistributedDataParallel.__init__`` and on ``fully_shard`` (one stack walk
and a pass over the parameters per call), in the baseline and every trial alike.
"""

from __future__ import annotations

import functools
import os
from typing import Any

MAX_ITEMS = 64


def ranked() -> bool:
    """This process is a rank of a torchrun launch."""
    return bool(os.environ.get("WORLD_SIZE"))


class DistSurvey:
    def __init__(self, patches: Any, mine: Any) -> None:
        self.patches = patches
        self.mine = mine  # () -> bool: the survey is live in this process
        self.ddp: list[dict[str, Any]] = []
        self.fsdp2: list[dict[str, Any]] = []
        self.group: dict[str, Any] = {}

    def install(self) -> None:
        import inspect

        from torch.nn.parallel import DistributedDataParallel as DDP

        from torchdoctor.instruments._sites import call_site, creation_site
        from torchdoctor.treat.dist import ddp_bucket_mb, wrap_fully_shard

        s = self
        sig = inspect.signature(DDP.__init__)

        def ddp_init(orig):
            def init(ddp, *a, **k):
                orig(ddp, *a, **k)
                if s.mine() and len(s.ddp) < MAX_ITEMS:
                    try:
                        bound = sig.bind(ddp, *a, **k)
                        params = [p for p in ddp.module.parameters() if p.requires_grad]
                        s.ddp.append({
                            "site": creation_site(ddp, 2), "bucket_cap_mb": ddp_bucket_mb(bound),
                            "bucket_cap_mb_list": bool(bound.arguments.get("bucket_cap_mb_list")),
                            "param_bytes": sum(p.numel() * p.element_size() for p in params),
                            "device": params[0].device.type if params else None})
                    except Exception:  # noqa: BLE001 - never break the user's script
                        pass
            return init

        def fs(orig):
            @functools.wraps(orig)
            def fully_shard(module, *a, **k):
                row = None
                if s.mine() and len(s.fsdp2) < MAX_ITEMS:
                    try:
                        mp = k.get("mp_policy")
                        row = {"site": call_site(2), "module": type(module).__name__,
                               "param_dtype": _dt(getattr(mp, "param_dtype", None)),
                               "reduce_dtype": _dt(getattr(mp, "reduce_dtype", None)),
                               "dtypes": sorted({_dt(p.dtype) for p in module.parameters()})}
                    except Exception:  # noqa: BLE001
                        row = None
                out = orig(module, *a, **k)
                if row is not None:
                    s.fsdp2.append(row)
                return out
            return fully_shard

        self.patches.wrap(DDP, "__init__", ddp_init)
        wrap_fully_shard(self.patches, fs)

    def snapshot(self) -> None:
        """The process group's backend and size (at the first step end: scripts destroy the
        group before the survey is recorded)."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.group = {"backend": str(dist.get_backend()), "world_size": dist.get_world_size()}
        except Exception:  # noqa: BLE001
            pass

    def record(self) -> dict[str, Any]:
        if not self.group:
            self.snapshot()
        return {"ddp": self.ddp, "fsdp2": self.fsdp2, "backend": self.group.get("backend"),
                "world_size": self.group.get("world_size") or int(os.environ.get("WORLD_SIZE") or 0) or None}


def _dt(d: Any) -> str | None:
    return None if d is None else str(d).replace("torch.", "")
