"""Trial trace: the per-step loss and the run's peak memory, for runs that are compared.

Armed by the trials layer (``torchdoctor/trials``: treat, repro, compile) through the needs
``loss_trace`` and ``peak_memory``; a plain probe run does not arm it.

* **Loss**: the tensor passed to the outermost ``backward`` (``ctx.last_backward_tensor``),
  detached, kept on its device, one per step (the last backward of the step; a non-scalar loss
  is reduced to its mean, a complex one to its real part). Nothing is read during the run — no
  device sync on the user's step: the kept scalars are stacked and read once at the end
  (``MAX_STEPS`` at most, so memory stays bounded). Steps without a backward have ``None``.
* **Peak memory**: at the end, ``torch.cuda.max_memory_allocated`` per device in use (the CUDA
  caching allocator's peak of live tensors), ``torch.cuda.max_memory_reserved`` (the segments it
  held: what fragmentation and the allocator's settings change) and the process's peak resident
  set (``getrusage``), the host figure for CPU runs.

* **Synchronised window** (CUDA only): the host runs ahead of the GPU, so a trial's step time is
  not its host wall. One ``torch.cuda.synchronize()`` at the end of step ``WINDOW_FROM - 1``
  (after the warm-up step and the FLOP counter's step) and one at the end of the last step
  (``--steps``): ``trial_window`` {from_step, to_step, steps, wall_s} — steps / wall is exact.
  The two syncs fall between steps (outside every step's timing); without a step bound the
  run has no window and its steps are timed by the step-time basis (``evidence/steps.py``).

Events: ``trial_window`` (above), ``loss_trace`` {steps: [...], losses: [...]} (a non-finite loss is the string
``"nan"``, ``"inf"`` or ``"-inf"``: JSON has no such numbers) and ``peak_memory`` {cuda: {dev: bytes},
cuda_reserved: {dev: bytes}, host_rss: bytes}. Cost per step: one ``detach`` (and a ``mean`` for a non-scalar loss).
"""

from __future__ import annotations

import math
from typing import Any

from torchdoctor.instruments.base import Instrument, register

MAX_STEPS = 100_000
WINDOW_FROM = 3


@register
class TrialTrace(Instrument):
    name = "trial_trace"
    produces = frozenset({"loss_trace", "peak_memory", "trial_window"})
    priority = 85

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self.pending: Any = None  # the current step's loss (detached)
        self.kept: list[tuple[int, Any]] = []  # (step, detached scalar)
        self.last_step = int((getattr(ctx, "options", None) or {}).get("steps") or 0)
        self.w0: float | None = None

    def on_backward_begin(self, ctx: Any) -> None:
        t = ctx.last_backward_tensor
        torch = self.torch
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
            return
        from torchdoctor.numerics.tensors import kept_scalar

        d = t.detach()
        if d.is_complex():
            d = d.real
        if d.numel() != 1:
            d = d.float().mean() if d.numel() else None
        # kept until the end of the run: never a view of the loss's (possibly large) storage
        self.pending = kept_scalar(d.reshape(())) if d is not None else None

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.pending is not None and len(self.kept) < MAX_STEPS:
            self.kept.append((step, self.pending))
        self.pending = None
        if self.last_step >= WINDOW_FROM and step in (WINDOW_FROM - 1, self.last_step):
            self._window_edge(ctx, step)

    def _window_edge(self, ctx: Any, step: int) -> None:
        import time

        cuda = self.torch.cuda
        if not (cuda.is_available() and cuda.is_initialized()):
            return
        cuda.synchronize()
        now = time.perf_counter()
        if step == WINDOW_FROM - 1:
            self.w0 = now
        elif self.w0 is not None:
            ctx.emit("trial_window", from_step=WINDOW_FROM, to_step=step,
                     steps=step - WINDOW_FROM + 1, wall_s=round(now - self.w0, 7))
            self.w0 = None

    def uninstall(self, ctx: Any) -> None:
        kept = getattr(self, "kept", None)
        if kept is None:
            return
        torch = self.torch
        steps = [s for s, _ in kept]
        by_device: dict[Any, list[int]] = {}
        for i, (_s, t) in enumerate(kept):
            by_device.setdefault(t.device, []).append(i)
        values: list[float | str | None] = [None] * len(kept)
        for _dev, idx in by_device.items():  # one read per device
            read = torch.stack([kept[i][1].double() for i in idx]).tolist()
            for i, v in zip(idx, read):
                values[i] = v if math.isfinite(v) else str(v)
        ctx.emit("loss_trace", steps=steps, losses=values)
        peak: dict[str, Any] = {"host_rss": _peak_rss()}
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                peak["cuda"] = {str(d): int(torch.cuda.max_memory_allocated(d))
                                for d in range(torch.cuda.device_count())
                                if torch.cuda.memory_allocated(d) or torch.cuda.max_memory_allocated(d)}
                peak["cuda_reserved"] = {d: int(torch.cuda.max_memory_reserved(int(d))) for d in peak["cuda"]}
        except Exception:  # noqa: BLE001 - a broken CUDA context: no device figure
            pass
        ctx.emit("peak_memory", **peak)


def _peak_rss() -> int | None:
    try:
        import resource
        import sys

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(kb if sys.platform == "darwin" else kb * 1024)
    except Exception:  # noqa: BLE001
        return None
