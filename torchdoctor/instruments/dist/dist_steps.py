"""Per-rank step arrivals on the host's common clock, for stragglers (ranked runs only).

Synchronous data parallelism makes every rank's *step time* equal: the fast ranks wait for
the slow one inside the gradient all-reduce (in ``backward`` under DDP). What differs is
when each rank *arrives* at the step's synchronisation: a rank that is late to start
``backward`` (slow data, a longer forward, extra work between steps such as rank-0-only
logging) makes the others wait. Each rank writes, per optimizer step, one ``dist_step``
event: ``bwd_at`` (start of the step's first ``backward``) and ``end_at`` (the step
boundary), both ``time.monotonic()`` seconds (CLOCK_MONOTONIC: one clock for all processes
of a host, so the ranks of a ``--standalone`` run compare directly), and ``coll_s``, the time
the step spent inside recorded ``torch.distributed`` calls (waiting for the others, when
the script averages by hand). Cost: three clock reads per step.
"""

from __future__ import annotations

import time
from typing import Any

from torchdoctor.instruments.base import Instrument, register


@register
class RankClock(Instrument):
    name = "dist_steps"
    produces = frozenset({"dist_step"})  # inert unless the run is ranked
    priority = 12

    def install(self, ctx: Any) -> None:
        self.on = bool(ctx.options.get("nproc_per_node"))
        self.bwd_at: float | None = None
        self.coll0 = 0.0

    def on_backward_begin(self, ctx: Any) -> None:
        if self.on and self.bwd_at is None:
            self.bwd_at = time.monotonic()

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.on:
            return
        from torchdoctor.instruments.dist import dist_collectives

        rec = dist_collectives.CURRENT
        coll = rec.wait_s if rec is not None else 0.0
        ctx.emit("dist_step", step=step, bwd_at=None if self.bwd_at is None else round(self.bwd_at, 6),
                 end_at=round(time.monotonic(), 6), coll_s=round(coll - self.coll0, 6))
        self.bwd_at = None
        self.coll0 = coll
