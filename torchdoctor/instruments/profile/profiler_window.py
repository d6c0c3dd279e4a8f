"""The profiler window: torch.profiler over a few steps after warm-up, analysed in the child.

Armed by the ``profile`` probe. A scheduled ``torch.profiler.profile`` is stepped from the
optimizer step hook (no change to the user's script): ``wait`` steps untouched, ``warmup``
steps armed and discarded, ``active`` steps recorded with shapes and Python stacks (CUDA
activity too when a GPU is visible). When the window closes, the trace is exported under
``--out`` (Chrome/Perfetto JSON, gzip above ``trace_max_mb``), the profile is flattened
(``_profiler_compat``) and analysed (``_profile_analysis``) into a handful of compact
evidence events — never the raw profile:

``profile_window`` (status, window steps, device, numerics flags, trace path, cost),
``profile_ops``, ``profile_host``, ``profile_python`` and, with a GPU, ``profile_device``,
``profile_kernels``, ``profile_gemm``, ``profile_copies``, ``profile_syncs``.

The rules judge device figures against the *un-profiled* step time of the step clock (the
``step`` events of the steps the window did not touch): the Python tracer slows the host
during the active steps, never the device.

The window's cost is bounded *before* it is paid (``budget`` in ``profile_window``): the Python
tracer records every Python call, and a step that makes tens of thousands of them (a Dataset
that decodes images in Python per sample) turned a 3-step window into a 33 MB trace and seconds
of post-processing. So the last waiting step counts the Python calls of the main thread with a
trivial ``sys.setprofile`` counter (:func:`plan_budget`): the number of active steps is cut to
fit ``PY_EVENT_BUDGET`` calls, and Python stacks are left off altogether when even one step
makes more than ``STACK_OFF_FACTOR`` × that (the torch-op view stays; Python hotspots are then
not listed). While recording, the window stops early once the recorded steps took more than
``RECORD_SLOWDOWN_MAX`` × the un-profiled step time (and at least ``RECORD_MIN_S``).

Options (``ctx.options``): ``profile_skip`` (wait steps, default 5, shrunk to fit ``steps``),
``profile_active`` (default 3), ``profile_warmup`` (default 1), ``trace_max_mb`` (default 256),
``profile_dump_flat`` (or env ``TORCHDOCTOR_PROFILE_FLAT=1``: also write the flattened profile as
``profile_flat.json.gz`` in the run dir, to debug the analysis or make test fixtures).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from torchdoctor.instruments.base import Instrument, register

from torchdoctor.instruments.profile._profile_plan import (  # noqa: F401 - re-exported
    DEFAULT_TRACE_MAX_MB, PY_EVENT_BUDGET, STACK_OFF_FACTOR, _CallCounter, make_sources,
    plan_budget, plan_window)

RECORD_SLOWDOWN_MAX = 4.0  # recorded steps this many times the un-profiled step time ...
RECORD_MIN_S = 0.5  # ... and at least this long: the window stops after the current step
MAX_BOUNDARIES = 64  # step boundary times kept, to tell an empty window's cause
BURST_S = 0.005  # each step of an empty window ended within this of the previous: boundaries placed after
# the fact (measured 0.07-0.3 ms apart on the CPU box, idle; a step that runs a torch op is recorded)


def _world() -> int:
    """The world size of a rank launched by torchrun (1 otherwise): the collectives table's n."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


@register
class ProfilerWindow(Instrument):
    name = "profiler_window"
    produces = frozenset({"profile_window", "profile_ops", "profile_host", "profile_python",
                          "profile_device", "profile_kernels", "profile_gemm", "profile_gemm_shapes",
                          "profile_copies",
                          "profile_syncs", "profile_collectives"})
    priority = 80  # after the step clock: its step time excludes our prof.step() call

    def install(self, ctx: Any) -> None:
        from torchdoctor.instruments.profile import _profiler_compat as compat

        self.ctx = ctx
        self.prof = None
        self.done = False
        self.closed = False
        self.steps_seen = 0
        self.frozen = False  # another thread began training inside the window (_skip_for_threads)
        self.wait, self.warmup, self.active = plan_window(ctx.options)
        self.counter: _CallCounter | None = None
        self.budget: dict[str, Any] = {}
        self.t_last = time.perf_counter()
        self.plain_s: list[float] = []  # un-profiled step times before the window (step 1 left out)
        self.rec_s: list[float] = []  # recorded step times
        self.stopped_early: str | None = None
        self.gaps: list[float] = []  # per step boundary (the first MAX_BOUNDARIES): the script's time before it
        self.t_out = self.t_last  # when our previous on_step_end returned
        reason = compat.unavailable_reason()
        if reason:
            ctx.emit("profile_window", status="unavailable", reason=reason)
            self.done = self.closed = True
            return
        self.cuda = compat.cuda_wanted()
        with compat.quiet_kineto():
            self.prof = compat.make_profiler(self.wait, self.warmup, self.active, self.cuda, self._ready)
            self.prof.start()
        if self.wait >= 2 and not ctx.options.get("profile_no_budget"):
            self.count_at = self.wait - 1  # the last waiting step is counted
        else:
            self.count_at = None

    # ------------------------------------------------------------------ per step

    def on_step_end(self, ctx: Any, step: int) -> None:
        self.steps_seen += 1
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        if self.steps_seen <= MAX_BOUNDARIES:
            self.gaps.append(now - self.t_out)  # the script's time since our previous boundary returned
        try:
            self._on_step_end(ctx, dt)
        finally:
            self.t_out = time.perf_counter()

    def _on_step_end(self, ctx: Any, dt: float) -> None:
        if (self.prof is not None and not self.closed and not self.frozen
                and ctx.in_owner_process()):
            if self.done:
                self._close()
                return
            n = self.steps_seen
            if 1 < n <= self.wait:
                self.plain_s.append(dt)
            if self.counter is not None and n == self.wait:
                self._plan(self.counter.stop())
                self.counter = None
            first_rec = self.wait + self.warmup + 1
            if first_rec <= n < self.wait + self.warmup + self.active:
                self.rec_s.append(dt)
                if self._over_budget():
                    self._stop_early()
                    return
            self._step()
            if self.count_at is not None and n == self.count_at and not self.closed:
                if ctx.in_owner_thread():
                    self.counter = _CallCounter()

    def _plan(self, calls: int | None) -> None:
        """Fit the window to the budget before the warm-up prepares the profiler."""
        from torchdoctor.instruments.profile import _profiler_compat as compat

        plan = plan_budget(calls, self.active, PY_EVENT_BUDGET)
        if (plan["active"], plan["with_stack"]) != (self.active, True):
            if compat.set_window(self.prof, self.wait, self.warmup, plan["active"], plan["with_stack"]):
                self.active = plan["active"]
            else:
                plan["reason"] = "this torch cannot re-plan the window: " + plan.get("reason", "")
        self.budget = plan

    def _over_budget(self) -> bool:
        """The recorded steps cost far more than un-profiled ones: the tracer dominates."""
        rec = sum(self.rec_s)
        if rec < RECORD_MIN_S:
            return False
        plain = sorted(self.plain_s)[len(self.plain_s) // 2] if self.plain_s else 0.0
        return plain <= 0 or rec > RECORD_SLOWDOWN_MAX * plain * len(self.rec_s)

    def _stop_early(self) -> None:
        """Close the window after the steps recorded so far (their analysis still runs)."""
        from torchdoctor.instruments.profile._profiler_compat import quiet_kineto

        plain = sorted(self.plain_s)[len(self.plain_s) // 2] if self.plain_s else None
        self.stopped_early = (f"stopped after {len(self.rec_s)} recorded step(s): they took "
                              f"{sum(self.rec_s):.2f} s"
                              + (f" vs {plain * 1e3:.3g} ms per un-profiled step" if plain else ""))
        self.active = len(self.rec_s)
        self.closed = True
        try:
            with quiet_kineto():
                self.prof.stop()  # RECORD -> stop_trace + on_trace_ready (_ready)
        finally:
            self.prof = None

    def _step(self) -> None:
        from torchdoctor.instruments.profile._profiler_compat import quiet_kineto

        prof = self.prof
        try:
            changes = prof.schedule(prof.step_num + 1) != prof.current_action
        except Exception:  # noqa: BLE001
            changes = True
        if changes:
            if self.ctx.other_trainers_alive():
                self._skip_for_threads(prof)
                return
            with quiet_kineto():
                prof.step()
        else:
            prof.step()

    def _skip_for_threads(self, prof: Any) -> None:
        """Another thread of the script trains too: starting (or switching) the profiler while
        other threads run ops crashed the process (SIGSEGV in ``_start_trace``). Before the
        trace began the window is given up; once it runs it is left as it is and stopped at
        teardown, after the script's threads ended."""
        from torch.profiler import ProfilerAction

        if prof.current_action == ProfilerAction.NONE:  # waiting: no trace started yet
            self.done = self.closed = True
            self.prof = None
            self.ctx.emit("profile_window", status="unavailable",
                          reason="other threads of the script train at the same time; starting "
                                 "torch.profiler while other threads run ops can crash the "
                                 "process, so no window was recorded")
            prof.stop()  # nothing was started: no native work
        else:
            self.frozen = True

    def _close(self) -> None:
        from torchdoctor.instruments.profile._profiler_compat import quiet_kineto

        self.closed = True
        try:
            with quiet_kineto():
                self.prof.stop()
        finally:
            self.prof = None

    # ------------------------------------------------------------------ window end

    def _ready(self, prof: Any) -> None:
        """on_trace_ready: export, flatten, analyse, emit. Never raises into the script."""
        ctx = self.ctx
        self.done = True
        t0 = time.perf_counter()
        info: dict[str, Any] = {"status": "ok" if self.steps_seen >= self.wait + self.warmup + self.active
                                else "partial",
                                "wait": self.wait, "warmup": self.warmup, "active": self.active,
                                "first_step": self.wait + self.warmup + 1, "cuda": self.cuda}
        if self.budget:
            info["budget"] = self.budget
        if self.stopped_early:
            info["stopped_early"] = self.stopped_early
        # the script's own time before each step boundary (our and other instruments' boundary work left
        # out): back-to-back boundaries are steps ended after the fact
        info["boundary_gaps_ms"] = [round(g * 1e3, 3) for g in self.gaps[:self.wait + self.warmup + self.active + 1]]
        try:
            from torchdoctor.instruments.profile import _profiler_compat as compat
            from torchdoctor.instruments.profile._profile_analysis import analyze

            try:
                info.update(self._export(prof))
            except Exception as e:  # noqa: BLE001 - no trace file, the analysis still stands
                info.update(trace=None, trace_error=f"{type(e).__name__}: {e}")
            if info.get("trace"):
                ctx.emit("artifact", name="trace", path=info["trace"])
            flat = compat.collect(prof)
            # the run ended inside the window: its last step range ends at the profiler's stop
            flat["last_step_open"] = info["status"] == "partial"
            info["collect_s"] = round(time.perf_counter() - t0, 3)
            if ctx.options.get("profile_dump_flat") or os.environ.get("TORCHDOCTOR_PROFILE_FLAT"):
                with gzip.open(Path(ctx.run_dir) / "profile_flat.json.gz", "wt") as f:
                    json.dump(flat, f)
            flags = compat.torch_flags()
            dev = compat.device_info()
            payloads = analyze(flat, make_sources(), flags, world=_world())
            window = payloads.pop("profile_window")
            window.update(info, flags=flags, device=dev, analysis_s=round(time.perf_counter() - t0, 3))
            if window.get("active_steps") and not (payloads.get("profile_ops") or {}).get("by_self_cpu"):
                # steps were recorded but not one torch op: another profiler in the script holds
                # the op callbacks; judging this window would call every step "pure Python"
                window.update(status="empty", reason=self._empty_reason())
                payloads = {}
            ctx.emit("profile_window", **window)
            for kind, data in payloads.items():
                ctx.emit(kind, **data)
        except Exception as e:  # noqa: BLE001 - the measurement is lost, the script goes on
            info.update(status="failed", error=f"{type(e).__name__}: {e}",
                        traceback=traceback.format_exc(limit=8))
            ctx.emit("profile_window", **info)

    def _empty_reason(self) -> str:
        """Why recorded steps hold no torch op, from what was measured."""
        first, last = self.wait + self.warmup, self.wait + self.warmup + self.active
        if last <= len(self.gaps) and first >= 1:
            span = sum(self.gaps[first:last])  # the script's own time inside the recorded steps
            if max(self.gaps[first:last]) < BURST_S:
                j, e = last - 1, last  # the run of back-to-back boundaries holding the window
                while j > 0 and self.gaps[j] < BURST_S:
                    j -= 1
                while e < len(self.gaps) and self.gaps[e] < BURST_S:
                    e += 1
                return (f"the {self.active} recorded steps ended together, within {span * 1e3:.2g} ms: "
                        f"their step boundaries were placed after the fact (several optimizers: the step "
                        f"clock first learns their cycle, then ends the steps already run at once, up to step {e}), "
                        f"so no op ran while the profiler recorded; profile later steps with --skip {e}")
        return ("the profiler recorded no torch op in the window although its steps took time: another "
                "profiler in the script (torch.profiler, Kineto, a framework's profiler callback) may hold "
                "the op callbacks")

    def _export(self, prof: Any) -> dict[str, Any]:
        """Write the trace under --out (gzip above the cap; dropped if still above)."""
        from torchdoctor.instruments.profile._profiler_compat import export_trace

        out = getattr(self.ctx, "out_dir", None)
        if not out:
            return {"trace": None}
        cap = float(self.ctx.options.get("trace_max_mb") or DEFAULT_TRACE_MAX_MB) * 1024 * 1024
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "trace.json"
        t0 = time.perf_counter()
        export_trace(prof, str(path))
        size = path.stat().st_size
        res: dict[str, Any] = {"trace": str(path), "trace_bytes": size}
        if size > cap:
            gz = path.with_suffix(".json.gz")
            with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            path.unlink()
            res.update(trace=str(gz), trace_bytes=gz.stat().st_size, trace_raw_bytes=size)
            if gz.stat().st_size > cap:
                gz.unlink()
                res.update(trace=None, trace_dropped=f"{size / 2**20:.0f} MiB exceeds trace_max_mb")
        res["export_s"] = round(time.perf_counter() - t0, 3)
        return res

    # ------------------------------------------------------------------ end of run

    def uninstall(self, ctx: Any) -> None:
        if self.counter is not None:
            self.counter.stop()
            self.counter = None
        if self.prof is None or self.closed:
            return
        if self.done:
            self._close()
            return
        from torchdoctor.instruments.profile._profiler_compat import quiet_kineto

        self.closed = True
        try:
            with quiet_kineto():
                self.prof.stop()  # in a RECORD state this calls _ready: a partial window
        finally:
            self.prof = None
        if not self.done:
            ctx.emit("profile_window", status="not-reached", wait=self.wait, warmup=self.warmup,
                     active=self.active, steps_seen=self.steps_seen,
                     steps_needed=self.wait + self.warmup + self.active,
                     optimizers_stepped=len(getattr(ctx, "optimizers", None) or []))
