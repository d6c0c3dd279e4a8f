"""The per-step memory sampler (probes ``memory`` and ``checkup``): cheap, every step.

At each step boundary it writes one ``mem`` event: the C heap in use and RSS of the host,
and per CUDA device the allocator's allocated / reserved bytes and their peaks; with
saved-tensor tracking on (``memory`` probe) it also samples them at the start of backward
(the activation peak of the step). Cost per step: one ``mallinfo2`` call (0.4 us on a quiet
heap, ~15 us inside a training loop on the CPU box: it walks glibc's free lists), a read of
/proc/self/statm every :data:`RSS_EVERY` steps (every step without a heap counter), one
allocator-stats read per device (host-side, no device sync). Peaks are never reset (the
script may read them).

When a series keeps rising after warm-up (:func:`torchdoctor.memory.trend.rising` over
:data:`SUSPECT_SAMPLES` boundaries) by at least the growth rule's minimum rise, it arms a short
*site window* whatever the rate (a kept loss graph grows a few KiB a step: slow against a large
host's room, still a leak whose line must be named; the severity is the rule's)
(:class:`torchdoctor.memory.window.SiteWindow`, a few steps, once) that records which lines
allocate the memory that survives (``mem_sites`` event): a dispatch-mode tracker (CPU and
CUDA), on CUDA allocator snapshots with Python stacks, on the host ``tracemalloc``. The window
has a time budget of a few median step times and degrades (tracemalloc first) or ends early
to stay within it. Outside that window nothing else runs.

At a crash it records the breakdown of what was live and the top allocation sites
(``crash_context`` for ``out-of-memory``: the crash rule keeps it for an out-of-memory crash
and ranks the fixes in the parent); on CUDA the numbers come from the
allocator's OOM observer, called before the stack unwinds, which also writes the memory_viz
snapshot when memory history is on (``memory`` probe).
"""

from __future__ import annotations

from collections import deque
from statistics import median
from time import perf_counter
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.memory import cuda, session
from torchdoctor.memory.host import host_memory, rss_bytes
from torchdoctor.memory.trend import rising
from torchdoctor.memory.units import KiB, human_bytes
from torchdoctor.memory.window import SiteWindow, budget_for

WARMUP_STEPS = 3  # boundaries ignored by the online suspicion test
SUSPECT_SAMPLES = 5  # consecutive post-warm-up samples that must rise to arm the site window
SUSPECT_MIN_RISE = 4 * KiB  # mean rise per step (bytes) that arms it
# ... once the series has also risen this much since warm-up: the memory-growth judgment's own
# minimum fitted rise (growth.GROWTH_MIN_RISE), so a window is never spent on growth too small to
# report (on a GPU the window's dispatch tracker and snapshots cost a step or more)
SUSPECT_MIN_TOTAL = 128 * KiB
# and it must have risen this much per step on average since warm-up: a burst of a few
# steps on a flat series (a dict resize, the harness's own bookkeeping) is not the sustained
# growth the rule reports (>= 4 KiB/step over the whole series); such a burst armed a window
# that cost 0.5 s on the CPU box's MLP benchmark and found nothing
SUSPECT_MIN_SLOPE_SINCE = SUSPECT_MIN_RISE // 2
MAX_WINDOWS = 1
DEVICE_RECHECK = 50  # re-list CUDA devices in use every N steps
RSS_EVERY = 8  # RSS sampled every N steps while the heap counter works (only judged without it)
STEP_TIMES = 32  # recent step intervals kept for the median step time (window budget, impact)


@register
class MemorySampler(Instrument):
    name = "memory_sampler"
    produces = frozenset({"mem", "mem_device", "mem_end", "mem_info", "mem_oom", "mem_sites"})
    priority = 60

    def install(self, ctx: Any) -> None:
        self.ctx = ctx
        self.sess = session.current()
        self.heap = self.sess.heap_counter()
        self.devs: list[int] = []
        self.devices_reported: set[int] = set()
        self._bwd: list | None = None
        self.recent: dict[str, deque] = {}
        self.after_warmup: dict[str, tuple[int, int]] = {}  # (first post-warm-up value, step)
        self.window: SiteWindow | None = None
        self.windows = 0
        self.walls: deque = deque(maxlen=STEP_TIMES)  # recent step intervals (window excluded)
        self._t_prev: float | None = None
        self.capacity: dict[int, int] = {}  # CUDA device -> total bytes
        self.host = host_memory()
        self.oom: dict[str, Any] | None = None
        # the CUDA alloc/free trace (memory --history-trace) grows in host memory: heap unjudged
        self.trace = bool(ctx.options.get("memory_history_trace")) and ctx.probe == "memory"
        ctx.emit("mem_info", heap_counter=self.heap.name if self.heap.available else None,
                 baseline_heap=self.sess.base_heap, baseline_rss=self.sess.base_rss,
                 host=self.host, cuda_available=cuda.available(), alloc_conf=cuda.alloc_conf(),
                 history_trace=self.trace)
        cuda.on_init(lambda: cuda.attach_oom_observer(self._on_oom))

    # ---- sampling ------------------------------------------------------------------------
    def _cuda_alloc(self) -> int | None:
        if not self.devs:
            return None
        total = 0
        for d in self.devs:
            s = cuda.stats(d)
            if s:
                total += s["allocated"]
        return total

    def on_backward_begin(self, ctx: Any) -> None:
        if not self.devs and ctx.step == 0:
            self._refresh_devices(0)
        saved = self.sess.saved
        if saved is None:  # nothing reads the backward-start sample without activations
            return
        h = self.heap.read()
        a = self._cuda_alloc()
        keys = self.sess.refresh_param_keys(ctx.models())
        act = saved.live_bytes(bool(self.devs), keys)[0]
        b = self._bwd
        if b is None:
            self._bwd = [h, a, act]
        else:
            self._bwd = [max(x, y) if x is not None and y is not None else (x if y is None else y)
                         for x, y in zip(b, (h, a, act))]

    def _refresh_devices(self, step: int) -> None:
        if (not self.devs or step % DEVICE_RECHECK == 0) and cuda.initialized():
            self.devs = cuda.devices_in_use()
            for d in self.devs:
                if d not in self.devices_reported:
                    self.devices_reported.add(d)
                    info = cuda.device_info(d)
                    if info:
                        self.capacity[d] = int(info.get("capacity") or 0)
                        self.ctx.emit("mem_device", **info)

    def on_step_end(self, ctx: Any, step: int) -> None:
        now = perf_counter()
        if self._t_prev is not None and self.window is None:
            self.walls.append(now - self._t_prev)
        self._refresh_devices(step)
        heap = self.heap.read()
        rec: dict[str, Any] = {"step": step, "heap": heap}
        if heap is None or step % RSS_EVERY == 1:
            rec["rss"] = rss_bytes()
        alloc_total = None
        if self.devs:
            per = {}
            alloc_total = 0
            for d in self.devs:
                s = cuda.stats(d)
                if s:
                    per[str(d)] = [s["allocated"], s["reserved"], s["peak_allocated"], s["peak_reserved"]]
                    alloc_total += s["allocated"]
            rec["cuda"] = per
        if self.sess.saved is not None:
            rec["saved"] = self.sess.saved.live_bytes(bool(self.devs))[0]
        if self._bwd is not None:
            h, a, act = self._bwd
            rec["bwd"] = {"heap": h, "cuda": a, "act": act}
            self._bwd = None
        if self.window is not None:
            rec["window"] = True  # the site window's own bookkeeping sits in this heap sample
        ctx.emit("mem", **rec)
        self._window_tick(step, {"heap": rec["heap"], "cuda": alloc_total})
        self._t_prev = perf_counter()  # the next interval leaves out our own boundary work

    def step_seconds(self) -> float | None:
        """Median of the recent step intervals (the window's own steps left out)."""
        return median(self.walls) if len(self.walls) >= 3 else None

    # ---- allocation-site window --------------------------------------------------------
    def _window_tick(self, step: int, values: dict[str, int | None]) -> None:
        if self.window is not None:
            if self.window.boundary(step):
                self._finish_window(step)
                self._t_prev = None  # the interval after the window holds its finish
            return
        if self.windows >= MAX_WINDOWS or step <= WARMUP_STEPS:
            return
        armed = None
        for key, v in values.items():
            if v is None or (key == "heap" and self.trace and self.devs):
                continue
            q = self.recent.get(key)
            if q is None:
                q = self.recent[key] = deque(maxlen=SUSPECT_SAMPLES + 1)
            q.append(v)
            first, first_step = self.after_warmup.setdefault(key, (v, step))
            # the mean rise bounds the test from above: most steps stop at this subtraction
            if (len(q) == q.maxlen and q[-1] - q[0] >= SUSPECT_MIN_RISE * SUSPECT_SAMPLES
                    and v - first >= max(SUSPECT_MIN_TOTAL,
                                         (step - first_step) * SUSPECT_MIN_SLOPE_SINCE)
                    and rising(list(q), SUSPECT_MIN_RISE)):
                armed = key
        if armed:
            self.windows += 1
            step_s = self.step_seconds()
            self.window = SiteWindow(step, use_cuda=bool(self.devs), history_on=self.sess.history,
                                     host=armed == "heap", step_s=step_s,
                                     budget_s=budget_for(step_s))
            self.window_reason = armed

    def _finish_window(self, step: int) -> None:
        w, self.window = self.window, None
        out = w.finish(step)
        self.ctx.emit("mem_sites", reason=self.window_reason, **out)

    # ---- out of memory -------------------------------------------------------------------
    def _live(self, on_cuda: bool, allocated: int | None, reserved: int | None) -> dict[str, Any]:
        from torchdoctor.memory.breakdown import live_breakdown

        live = live_breakdown(self.ctx.models(), self.ctx.optimizers, self.sess.saved, on_cuda,
                              allocated)
        if reserved is not None and allocated is not None:
            live["parts"]["cached_free"] = max(0, reserved - allocated)
        return live

    def _on_oom(self, device: int, requested: int, capacity: int, device_free: int) -> None:
        """The CUDA allocator is about to raise OutOfMemoryError (the stack has not unwound)."""
        if self.oom is not None:
            self.oom["count"] += 1
            return
        try:
            self._record_oom(device, requested, capacity, device_free)
        except Exception as e:  # noqa: BLE001 - never turn an OOM into another error
            self.oom = {"count": 1, "error": f"{type(e).__name__}: {e}"}

    def _record_oom(self, device: int, requested: int, capacity: int, device_free: int) -> None:
        from torchdoctor.memory.sites import sites_of_blocks

        st = cuda.stats(device) or {}
        live = self._live(True, st.get("allocated"), st.get("reserved"))
        rec: dict[str, Any] = {"count": 1, "device": device, "requested_bytes": int(requested),
                               "capacity_bytes": int(capacity), "free_bytes": int(device_free),
                               "allocated_bytes": st.get("allocated"),
                               "reserved_bytes": st.get("reserved"), "live": live}
        snap = cuda.snapshot() if self.sess.history else None
        exclude = set(live.pop("addresses", {}))
        if snap and snap.get("segments"):  # block stacks exist only with memory history on
            rec["top_sites"] = sites_of_blocks(snap["segments"], exclude=exclude)
        where = self.ctx.out_dir
        if snap is not None and where is not None:
            path = where / "memory_snapshot_oom.pickle"
            where.mkdir(parents=True, exist_ok=True)
            if cuda.dump_snapshot(path, snap):
                rec["snapshot"] = str(path)
                self.ctx.emit("artifact", name="memory_snapshot", path=str(path))
        self.oom = rec
        self.ctx.emit("mem_oom", **{k: v for k, v in rec.items() if k != "live"},
                      breakdown=live["parts"])

    def _oom_from_observer(self) -> tuple[dict[str, Any], dict[str, Any]]:
        o = self.oom or {}
        ev = {k: o[k] for k in ("requested_bytes", "capacity_bytes", "free_bytes",
                                "allocated_bytes", "reserved_bytes") if o.get(k) is not None}
        ev["device"] = f"cuda:{o.get('device', 0)}"
        if o.get("top_sites"):
            ev["top_sites"] = [f"{s['site']}: {human_bytes(s['bytes'])} in {s['count']} blocks"
                               + (f" (called from {', '.join(s['called_from'])})" if s.get("called_from") else "")
                               for s in o["top_sites"]]
        if o.get("snapshot"):
            ev["memory_snapshot"] = o["snapshot"] + " (open in https://pytorch.org/memory_viz)"
        elif self.sess.history:
            ev["memory_snapshot"] = "re-run with --out DIR to keep a memory_viz snapshot"
        return ev, o["live"]

    def _oom_now(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Breakdown measured at the crash (no observer data: host OOM, or CUDA without it)."""
        st = cuda.stats(self.devs[0]) if self.devs else None
        if st:
            live = self._live(True, st["allocated"], st["reserved"])
            ev = {"allocated_bytes": st["allocated"], "reserved_bytes": st["reserved"],
                  "device": f"cuda:{self.devs[0]}"}
        else:
            live = self._live(False, None, None)
            h, base = self.heap.read(), self.sess.base_heap
            ev = {"device": "cpu", "rss": human_bytes(rss_bytes())}
            if h is not None and base is not None:
                ev["heap_in_use"] = human_bytes(h - base)
            hm = host_memory()
            if hm:
                ev["capacity_bytes"] = hm["total"]
                ev["free_bytes"] = hm["available"]
        live.pop("addresses", None)
        return ev, live

    def on_crash(self, ctx: Any, exc: BaseException) -> None:
        """What was live at the crash, measured at every crash (the child does not judge what
        the crash was): the crash rule keeps it for an out-of-memory crash and ranks the fixes
        (:func:`torchdoctor.memory.oom.oom_context`), in the parent."""
        ev, live = self._oom_from_observer() if self.oom and "live" in self.oom else self._oom_now()
        ctx.emit("crash_context", source=self.name, for_code="out-of-memory",
                 oom={"evidence": ev, "live": {"parts": live["parts"],
                                               "activations_fp32": live.get("activations_fp32", 0),
                                               "n_blocks": live.get("n_blocks", 0)}})

    # ---- end -----------------------------------------------------------------------------
    def uninstall(self, ctx: Any) -> None:
        if self.window is not None:
            w, self.window = self.window, None
            step = ctx.step
            if step - w.start >= 3:
                ctx.emit("mem_sites", reason=self.window_reason, **{"partial": True, **w.finish(step)})
            else:
                w.stop()
        end: dict[str, Any] = {"heap": self.heap.read(), "rss": rss_bytes()}
        per = {}
        for d in self.devs:
            s = cuda.stats(d)
            if s:
                per[str(d)] = s
        if per:
            end["cuda"] = per
        ctx.emit("mem_end", **end)
