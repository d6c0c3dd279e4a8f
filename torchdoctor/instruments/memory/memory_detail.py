"""The memory probe's costlier measurements (probe ``memory`` only).

* Saved-tensor hooks count the live bytes of activations (tensors saved for backward) for the
  whole run (:mod:`torchdoctor.memory.saved`); the sampler adds them to its samples.
* On CUDA, memory history with Python stacks is switched on when the script initialises CUDA
  (before its first allocation), so an OOM snapshot names the lines that allocated what was
  live and opens in pytorch.org/memory_viz. Default mode ``state``: stacks of live blocks
  only (bounded). ``--history-trace`` (option ``memory_history_trace``) records the alloc/free
  trace too (last HISTORY_ENTRIES events, memory_viz's timeline); its ring buffer lives in
  host memory and grows until full, so the host heap series is not judged then (measured on
  the H100: it rose ~150 KiB/step on a small transformer and armed the site window).
  Cost: one stack capture per allocation (bench/memory_overhead.py; docs/memory.md).
* The breakdown: at the start of backward of step :data:`BREAKDOWN_STEP` (optimizer state
  exists by then) it measures parameters, gradients present, optimizer state and activations
  against what is allocated at that moment (CUDA allocator, or the C heap above its pre-script
  baseline on the CPU); at the end of that step it adds the full gradient bytes and the peak.
  One ``mem_breakdown`` event.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.memory import cuda, session

BREAKDOWN_STEP = 2
HISTORY_ENTRIES = 20000  # alloc/free trace entries kept for memory_viz (ring buffer)


@register
class MemoryDetail(Instrument):
    name = "memory_detail"
    produces = frozenset({"mem_breakdown"})
    priority = 55  # before the sampler: it reads what this one arms

    def install(self, ctx: Any) -> None:
        from torchdoctor.memory.saved import SavedTensors

        self.sess = session.current()
        self.sess.heap_counter()
        saved = SavedTensors()
        if saved.install():
            self.sess.saved = saved
        steps = int(ctx.options.get("steps") or 0)
        self.target = min(BREAKDOWN_STEP, steps) if steps else BREAKDOWN_STEP
        self.pending: dict[str, Any] | None = None
        self.done = False
        self.mode = "all" if ctx.options.get("memory_history_trace") else "state"
        if ctx.options.get("memory_history", True):
            cuda.on_init(self._start_history)

    def _start_history(self) -> None:
        if cuda.start_history(self.mode, HISTORY_ENTRIES):
            self.sess.history = True
            self.sess.history_mode = self.mode

    def _measure(self, ctx: Any) -> dict[str, Any]:
        from torchdoctor.memory.breakdown import live_breakdown

        devs = cuda.devices_in_use()
        allocated = sum((cuda.stats(d) or {}).get("allocated", 0) for d in devs) if devs else None
        b = live_breakdown(ctx.models(), ctx.optimizers, self.sess.saved, bool(devs), allocated)
        b.pop("addresses", None)
        b["device"] = "cuda" if devs else "cpu"
        if not devs:
            h, base = self.sess.heap.read(), self.sess.base_heap
            if h is not None and base is not None:
                b["heap_above_baseline"] = h - base
        return b

    def on_backward_begin(self, ctx: Any) -> None:
        if self.done or self.pending is not None or ctx.step + 1 != self.target:
            return
        self.pending = self._measure(ctx)

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.done or step < self.target or self.pending is None:
            return
        from torchdoctor.memory.tensors import Accounting

        self.done = True
        b = self.pending
        on_cuda = b["device"] == "cuda"
        acc = Accounting(ctx.models(), ctx.optimizers, cuda=on_cuda)
        b["gradients_full"] = acc.bytes["gradients"]
        if on_cuda:
            b["peak"] = sum((cuda.stats(d) or {}).get("peak_allocated", 0) for d in cuda.devices_in_use())
            b["peak_reserved"] = sum((cuda.stats(d) or {}).get("peak_reserved", 0)
                                     for d in cuda.devices_in_use())
        b["step"] = step
        b["at"] = "backward start"
        if self.sess.saved is not None and self.sess.saved.skipped:
            b["skipped_layouts"] = self.sess.saved.skipped.as_dict()  # saved tensors not counted
        ctx.emit("mem_breakdown", **b)

    def uninstall(self, ctx: Any) -> None:
        if self.sess.saved is not None:
            self.sess.saved.uninstall()
        if self.sess.history:
            cuda.stop_history()
