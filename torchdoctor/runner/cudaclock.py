"""Device time per phase on CUDA, from CUDA events: no synchronisation inside the loop.

Host timers lie on an asynchronous device: ``loss.backward()`` returns long before the GPU has
run its kernels. The core records a pair of events around each phase (forward, backward,
optimizer) and one at each step end on the current stream; a step's events are read with
``Event.query()`` at a later step end, once the GPU has passed them (so reading never waits),
and once more at the end of the run (one ``synchronize`` after the script is done).

``step_device`` event: forward_ms / backward_ms / optimizer_ms (sum of the phase spans on the
device), span_ms (device time between the previous and this step-end event) and
``busy`` = (forward + backward + optimizer device ms) / host step wall, capped at 1. The phase
spans include idle gaps inside a phase (a launch-bound phase looks busy), so ``busy`` is an
upper bound of the kernel-busy fraction; the profiler's kernel list gives the exact figure.
"""

from __future__ import annotations

from collections import deque
from typing import Any

PHASES = ("forward", "backward", "optimizer")
MAX_PENDING = 64  # steps whose events are not done yet; beyond that the oldest are dropped


class CudaPhaseTimer:
    def __init__(self, ctx: Any):
        import torch

        self.ctx = ctx
        self._Event = torch.cuda.Event
        self.pool: list[Any] = []
        self.open: dict[str, Any] = {}
        self.cur: dict[str, list] = {p: [] for p in PHASES}
        self.prev_end: Any = None
        self.pending: deque = deque()
        self.device = torch.cuda.current_device()

    def _ev(self):
        return self.pool.pop() if self.pool else self._Event(enable_timing=True)

    def mark(self, phase: str, which: int) -> None:
        """which=0: the phase begins on the host; 1: it ends."""
        ev = self._ev()
        ev.record()
        if which == 0:
            old = self.open.get(phase)
            if old is not None:
                self.pool.append(old)
            self.open[phase] = ev
            return
        begin = self.open.pop(phase, None)
        if begin is None:
            self.pool.append(ev)
        else:
            self.cur[phase].append((begin, ev))

    def step_end(self, step: int, wall_s: float) -> None:
        end = self._ev()
        end.record()
        self.pending.append((step, wall_s, self.cur, self.prev_end, end))
        self.cur = {p: [] for p in PHASES}
        self.prev_end = end
        while len(self.pending) > MAX_PENDING:
            self._release(self.pending.popleft(), emit=False)
        self.flush()

    def flush(self, final: bool = False) -> None:
        while self.pending:
            item = self.pending[0]
            end = item[4]
            if final:
                end.synchronize()
            elif not end.query():
                return
            self.pending.popleft()
            self._release(item, emit=True)

    def _release(self, item, emit: bool) -> None:
        step, wall_s, pairs, start, end = item
        if emit:
            ms = {p: sum(b.elapsed_time(e) for b, e in pairs[p]) for p in PHASES}
            span = start.elapsed_time(end) if start is not None else None
            busy_ms = ms["forward"] + ms["backward"] + ms["optimizer"]
            busy = min(1.0, busy_ms / (wall_s * 1000.0)) if wall_s > 0 else None
            self.ctx.emit("step_device", step=step, device=self.device,
                          forward_ms=round(ms["forward"], 4), backward_ms=round(ms["backward"], 4),
                          optimizer_ms=round(ms["optimizer"], 4),
                          span_ms=round(span, 4) if span is not None else None,
                          busy=round(busy, 4) if busy is not None else None)
        for p in PHASES:
            for b, e in pairs[p]:
                self.pool += [b, e]
        if start is not None:
            self.pool.append(start)
