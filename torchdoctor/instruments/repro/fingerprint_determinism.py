"""Deterministic mode for one trial: ``repro``'s "what does determinism cost" pair of runs.

Idle unless the option ``repro_deterministic`` is set (the trial's Variation, which also sets
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the child's environment). Then, before the script runs:
``torch.use_deterministic_algorithms(True)`` (an op without a deterministic implementation
raises, naming itself) and ``torch.backends.cudnn.benchmark = False`` (no timing-dependent
algorithm choice). A script that sets either itself afterwards wins: what held at the end is
reported. Event: ``repro_mode`` {deterministic, deterministic_at_end, cudnn_benchmark_at_end,
cublas_workspace_config}.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register


@register
class FingerprintDeterminism(Instrument):
    name = "fingerprint_determinism"
    produces = frozenset({"repro_mode"})
    priority = 5  # before anything of the script's runs

    def install(self, ctx: Any) -> None:
        self.active = bool(ctx.options.get("repro_deterministic"))
        if not self.active:
            return
        import torch

        self.torch = torch
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False

    def uninstall(self, ctx: Any) -> None:
        if not self.active:
            return
        torch = self.torch
        ctx.emit("repro_mode", deterministic=True,
                 deterministic_at_end=bool(torch.are_deterministic_algorithms_enabled()),
                 cudnn_benchmark_at_end=bool(torch.backends.cudnn.benchmark),
                 cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
