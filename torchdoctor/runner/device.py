"""The ``device`` event: which device the script used, emitted by the step clock at step 1 and
by the harness when the run ends."""

from __future__ import annotations

import platform
import sys


def emit_device(ctx) -> None:
    """The device the script used (never initialises CUDA itself)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if torch.cuda.is_initialized():
        i = torch.cuda.current_device()
        ctx.emit("device", device=f"cuda:{i}", name=torch.cuda.get_device_name(i),
                 capability=list(torch.cuda.get_device_capability(i)))
    else:
        # not platform.processor(): it runs `uname -p` in a subprocess, a fork while the
        # script's other threads may be inside autograd
        ctx.emit("device", device="cpu", name=platform.machine())
