"""Backend treatments (child): ``cudnn-benchmark`` and ``expandable-segments``.

* ``cudnn-benchmark``: ``torch.backends.cudnn.benchmark = True`` before the script runs
  (restored on uninstall): cuDNN times its convolution algorithms for each new input shape and
  keeps the fastest. Worth it when the shapes repeat (the first step of each shape pays the
  search; the warm-up step is left out of the step time).
* ``expandable-segments``: applied by the parent as an environment variable of the run
  (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, joined to an existing value); the
  applier only records the setting the child saw, so that the fix names it.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.treat.child import Applier

ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"


def with_expandable(current: str) -> str:
    """``current`` allocator config with expandable segments on (other settings kept)."""
    parts = [p for p in (current or "").split(",") if p.strip() and not p.strip().startswith("expandable_segments")]
    return ",".join([*parts, EXPANDABLE])


class CudnnBenchmark(Applier):
    name = "cudnn-benchmark"

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self.saved = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        self.change("flag", None, "torch.backends.cudnn.benchmark = True")

    def on_step_end(self, ctx: Any, step: int) -> None:
        if step == 1 and self.torch.backends.cudnn.benchmark is not True:
            self.overridden("the script sets torch.backends.cudnn.benchmark itself after the "
                            "treatment set it: the run did not measure it")

    def uninstall(self, ctx: Any) -> None:
        super().uninstall(ctx)
        self.torch.backends.cudnn.benchmark = self.saved


class ExpandableSegments(Applier):
    name = "expandable-segments"

    def install(self, ctx: Any) -> None:
        seen = os.environ.get(ALLOC_ENV, "")
        if "expandable_segments:true" not in seen.lower():
            raise RuntimeError(f"{ALLOC_ENV} does not hold {EXPANDABLE} in the run ({seen!r})")
        self.change("env", None, f"{ALLOC_ENV}={seen} python train.py   # or, first thing in the "
                                 f"script: os.environ[{ALLOC_ENV!r}] = {seen!r}")


APPLIERS = {"cudnn-benchmark": CudnnBenchmark, "expandable-segments": ExpandableSegments}
