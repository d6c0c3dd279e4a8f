"""The allocation-site window: which lines allocate the memory that outlives its step.

Armed once by the memory sampler when a series keeps rising (and the rise would matter:
:func:`torchdoctor.memory.growth.impact`), it records :data:`WINDOW_STEPS` steps: a dispatch
tracker of new storages and of graphs (CPU and CUDA), allocator snapshots with Python stacks
(CUDA), and, when the host heap is what grows, Python-level allocations (``tracemalloc``).

**Its cost is bounded** (issue 13: an accelerate/BERT run paid 1.87x whole-run, four steps
under tracemalloc at 300 ms each, then a 2.8 s pause in ``compare_to``). The window gets a time
budget of :data:`WINDOW_BUDGET_STEPS` median step times (at least :data:`WINDOW_BUDGET_MIN_S`):
the extra wall time it adds (its start, the slowdown of its steps, its boundaries, its finish)
is measured at each of its boundaries against the median step time before it, and

* ``tracemalloc`` (the costliest part: a step that makes many small Python objects ran 6x
  slower traced with 1 frame, 14x with 8, on the CPU box) has a hard deadline, a share
  :data:`TRACE_SHARE` of the budget: a timer thread stops it there, even in the middle of a
  step (a window step of the bench workload took 1.3 s instead of 80 ms before that);
  Python-level sites are then skipped, tensors and graphs are still tracked;
* when the remaining steps plus the finish would overrun, ``tracemalloc`` is stopped at the
  boundary already;
* when even that overruns, the window is cut at this boundary and reports what it has
  (``partial``, with ``cut`` saying why);
* the finish is estimated before it runs (the gc scan as long as the first one, Python sites
  from the number of traced blocks) and a part that would overrun is skipped (``skipped``).

The Python-level sites are grouped from tracemalloc's raw traces by innermost user frame
(no ``Snapshot.compare_to``: its grouping by whole tracebacks cost ~10 s for 250k blocks on
the CPU box under load, the raw pass a small fraction of that).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torchdoctor.memory import cuda
from torchdoctor.memory.units import KiB

WINDOW_STEPS = 4  # steps recorded by the site window
TRACEMALLOC_FRAMES = 8  # Python frames kept per traced allocation (window on host memory only)
WINDOW_BUDGET_STEPS = 3.0  # the window may add at most this many median step times...
WINDOW_BUDGET_MIN_S = 0.5  # ...or this many seconds, whichever is larger
TRACE_COST_S = 3e-6  # finish cost per traced block (raw grouping pass: 2.9 us on the loaded CPU box)
TRACE_TABLE_BYTES = 46  # tracemalloc's own memory per traced block (to count them cheaply)
TRACE_SHARE = 0.5  # tracemalloc is stopped once it has used this share of the budget
PY_SITE_MIN_BYTES = 64 * KiB  # a Python-level site below this over the window is not listed


def budget_for(step_s: float | None) -> float:
    """The window's time budget (seconds of extra wall time) for a median step time."""
    return max(WINDOW_BUDGET_MIN_S, WINDOW_BUDGET_STEPS * (step_s or 0.0))


def _traced_blocks() -> int:
    """About how many blocks tracemalloc traces now, from the memory its tables use (cheap: no
    snapshot; ~46 bytes a block measured on 20k-750k blocks)."""
    import tracemalloc

    try:
        return tracemalloc.get_tracemalloc_memory() // TRACE_TABLE_BYTES
    except Exception:  # noqa: BLE001
        return 0


def _raw_traces(tracemalloc: Any) -> list:
    """[(domain, size, ((file, line), ...) most recent first, nframes)] of every traced block:
    the private ``_get_traces`` (no Trace/Frame objects), else through a snapshot."""
    get = getattr(tracemalloc, "_get_traces", None)
    if get is not None:
        return get()
    return [(0, t.size, tuple((f.filename, f.lineno) for f in reversed(t.traceback)), 0)
            for t in tracemalloc.take_snapshot().traces]


class SiteWindow:
    """Allocation-site recording over WINDOW_STEPS steps (see module docstring)."""

    def __init__(self, start_step: int, use_cuda: bool, history_on: bool, host: bool = False,
                 step_s: float | None = None, budget_s: float | None = None):
        from torchdoctor.memory.sites import DispatchTracker, active_blocks

        self._clock = time.perf_counter
        self.t0 = t0 = self._clock()
        self.start = start_step
        self.step_s = float(step_s or 0.0)
        self.budget_s = budget_s
        self.skipped: list[str] = []
        self.cut: str | None = None
        self.finish_s = 0.0
        self._active_blocks = active_blocks
        self.tracker = DispatchTracker()
        self.tracker_ok = self.tracker.start(start_step)
        self.live_first: int | None = None  # live CPU bytes of the first window step, at its end
        # (step, live CPU bytes of that step's own tensors at its end), each window step
        self.live_own: list[tuple[int, int]] = []
        self.tracing = False
        self._lock = threading.Lock()  # tracemalloc is stopped by the deadline timer or by us
        self._timer: threading.Timer | None = None
        if host:  # host memory rising: Python-level allocations are traced too (window only)
            import tracemalloc

            if not tracemalloc.is_tracing():
                tracemalloc.start(TRACEMALLOC_FRAMES)
                self.tracing = True
                if budget_s is not None:
                    left = budget_s * TRACE_SHARE - (self._clock() - t0)
                    self._timer = threading.Timer(max(0.0, left), self._deadline)
                    self._timer.daemon = True
                    self._timer.start()
        self.started_history = False
        self.snaps: list[dict] | None = None
        if use_cuda:
            if not history_on:
                self.started_history = cuda.start_history("state")
            if history_on or self.started_history:
                self.snaps = [self._snap()]
        self.start_s = self._clock() - t0
        self.cost_s = self.start_s  # our own time at the boundaries (snapshots, graph walks)

    # ---- cost control ------------------------------------------------------------------------
    def spent(self, n_steps: int) -> float:
        """Extra wall time so far: since the window began, less ``n_steps`` normal steps."""
        return self._clock() - self.t0 - n_steps * self.step_s

    def _finish_estimate(self) -> float:
        est = 0.0
        if self.tracing:
            est += _traced_blocks() * TRACE_COST_S
        return est

    def _deadline(self) -> None:
        """Timer thread: tracemalloc has used its share of the budget (mid-step, maybe)."""
        self._stop_tracing(f"stopped after {self.budget_s * TRACE_SHARE:.2g} s, its share of the "
                           f"window's time budget", from_timer=True)

    def _stop_tracing(self, why: str | None, from_timer: bool = False) -> None:
        import tracemalloc

        with self._lock:
            if self._timer is not None and not from_timer:
                self._timer.cancel()
            if not self.tracing:
                return
            tracemalloc.stop()
            self.tracing = False
            if why:
                self.skipped.append(f"Python-level sites (tracemalloc): {why}")

    def _over_budget(self, n: int) -> bool:
        """Check the budget after ``n`` window steps; stop tracemalloc or ask for a cut."""
        if self.budget_s is None:
            return False
        spent = self.spent(n)
        per_step = max(0.0, (spent - self.start_s) / max(1, n))
        left = WINDOW_STEPS - n
        if self.tracing and spent + per_step * left + self._finish_estimate() > self.budget_s:
            self._stop_tracing(f"stopped after {n} step(s) to stay within the window's time "
                               f"budget ({self.budget_s:.2g} s)")
        if left > 0 and spent + self._finish_estimate() > self.budget_s:
            self.cut = (f"the site window was cut after {n} of {WINDOW_STEPS} steps to stay "
                        f"within its time budget ({self.budget_s:.2g} s = max({WINDOW_BUDGET_STEPS:g} "
                        f"steps of {self.step_s * 1e3:.3g} ms, {WINDOW_BUDGET_MIN_S:g} s))")
            return True
        return False

    # ---- measurement -------------------------------------------------------------------------
    def _python_sites(self, n_steps: int) -> list[dict[str, Any]] | None:
        """Lines whose Python-level allocations (tracemalloc: bytearray, numpy, ...) made in the
        window are still alive, grouped by innermost user frame (raw traces, one pass)."""
        import tracemalloc

        from torchdoctor.memory.frames import loc
        from torchdoctor.runner.frames import is_user_file

        with self._lock:
            if not self.tracing:  # the deadline timer stopped it meanwhile
                return None
            try:
                raw = _raw_traces(tracemalloc)
            finally:
                tracemalloc.stop()
                self.tracing = False
                if self._timer is not None:
                    self._timer.cancel()
        user_of: dict[str, bool] = {}
        by: dict[Any, list] = {}
        for tr in raw:
            size, frames = tr[1], tr[2]
            user = []
            for fn, line in frames:
                u = user_of.get(fn)
                if u is None:
                    u = user_of[fn] = is_user_file(fn)
                if u:
                    user.append((fn, line, ""))
                    if len(user) == 3:
                        break
            key = tuple(user[:1])
            rec = by.get(key)
            if rec is None:
                rec = by[key] = [0, 0, tuple(user)]
            rec[0] += size
            rec[1] += 1
        out = [{"site": loc(k[0]) if k else "(no user frame)", "bytes": b, "count": c,
                "bytes_per_step": round(b / max(1, n_steps + 1)),
                "called_from": [loc(f) for f in fr[1:]]}
               for k, (b, c, fr) in by.items() if b >= PY_SITE_MIN_BYTES]
        out.sort(key=lambda d: -d["bytes"])
        return out[:5]

    def _snap(self) -> dict:
        return self._active_blocks(cuda.segments() or [])

    def boundary(self, step: int) -> str | None:
        """Record a step end: "done" when the window is complete, "cut" when its budget is
        spent, None to go on."""
        t0 = self._clock()
        n = step - self.start
        if self.tracker_ok:
            self.tracker.boundary(step)
            self.live_own.append((step, self.tracker.live_cpu_bytes(step)))
            if n == 1:
                self.live_first = self.live_own[-1][1]
        if self.snaps is not None:
            self.snaps.append(self._snap())
        self.cost_s += self._clock() - t0
        if n >= WINDOW_STEPS:
            return "done"
        return "cut" if self._over_budget(n) else None

    def _step_tensor_growth(self, last_step: int) -> int | None:
        """Bytes per step by which a step's passing tensors grew across the window: what each
        step held alive at its end (its batch, outputs, loss) less what is still alive now (kept:
        a cache entry, a leak, the parameters), first window step to the one before the last. A
        growing batch or sequence length raises it; a leak or a cache filling does not. None
        with fewer than two such steps."""
        kept = self.tracker.kept_cpu_bytes_by_step(last_step)
        own = [(st, b - kept.get(st, 0)) for st, b in self.live_own if st < last_step]
        if len(own) < 2:
            return None
        (s0, b0), (s1, b1) = own[0], own[-1]
        return round((b1 - b0) / (s1 - s0))

    def stop(self) -> None:
        """Undo everything without measuring (a window the run ended too early for)."""
        self.tracker.stop()
        if self.started_history:
            cuda.stop_history()
        self._stop_tracing(None)

    def finish(self, last_step: int) -> dict[str, Any]:
        from torchdoctor.memory.sites import group_sites, survivors_from_snapshots

        t_fin = self._clock()
        self.tracker.stop()
        if self.started_history:
            cuda.stop_history()
        n_done = last_step - self.start
        n = max(1, last_step - self.start - 1)
        py_sites = None
        if self.tracing:
            left = None if self.budget_s is None else self.budget_s - self.spent(n_done)
            est = _traced_blocks() * TRACE_COST_S
            if left is not None and est > left:
                self._stop_tracing(f"the grouping of ~{_traced_blocks():,} traced blocks "
                                   f"(~{est:.2g} s) would overrun the window's time budget")
            else:
                py_sites = self._python_sites(n)
        out: dict[str, Any] = {"steps": [self.start + 1, last_step],
                               "boundary_ms": round(self.cost_s * 1e3, 2)}
        if self.tracker_ok:
            surv = self.tracker.survivors(last_step)
            out["tensor_sites"] = group_sites(surv, n)
            out["tensor_survivor_bytes"] = sum(s.nbytes for s in surv)
            out["graph_growth"] = self.tracker.graph_growth()
            if self.tracker.skipped:  # sparse, nested, meta, ... tensors: not read, counted
                out["skipped_layouts"] = self.tracker.skipped.as_dict()
        if self.tracker_ok and self.live_first is not None and n_done >= 2:
            # live CPU tensor bytes per step: what the window's tensors hold at its end vs what
            # the first step's held at its end (bigger steps, or a leak, raise it; growth
            # outside torch does not)
            out["cpu_tensor_bytes_per_step"] = round(
                (self.tracker.live_cpu_bytes() - self.live_first) / (n_done - 1))
        if self.tracker_ok:
            grown = self._step_tensor_growth(last_step)
            if grown is not None:
                out["cpu_step_tensor_growth"] = grown
        if py_sites is not None:
            out["python_sites"] = py_sites
        if self.snaps is not None and len(self.snaps) >= 3:
            surv = survivors_from_snapshots(self.snaps, self.start + 1)
            out["cuda_sites"] = group_sites(surv, n)
            out["cuda_survivor_bytes"] = sum(s.nbytes for s in surv)
        self.finish_s = self._clock() - t_fin
        out["cost"] = {"start_ms": round(self.start_s * 1e3, 1),
                       "extra_ms": round(self.spent(n_done) * 1e3, 1),
                       "finish_ms": round(self.finish_s * 1e3, 1),
                       "budget_ms": None if self.budget_s is None else round(self.budget_s * 1e3, 1),
                       "step_ms": round(self.step_s * 1e3, 2)}
        if self.cut:
            out["cut"] = self.cut
            out["partial"] = True
        if self.skipped:
            out["skipped"] = list(self.skipped)
        return out
