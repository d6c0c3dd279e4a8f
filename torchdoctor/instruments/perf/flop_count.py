"""FLOPs of one training step, counted with torch's own FLOP counter (the yardstick's numerator).

What it measures: the floating-point operations of one whole step (forward, backward, the
optimizer, whatever the script does between two optimizer steps) as torch's
``torch.utils.flop_counter.FlopCounterMode`` counts them: matmuls, convolutions and attention
(``flop_registry``: mm, addmm, bmm, baddbmm, convolution and its backward, the scaled-dot-product
attention kernels, ...), forward and backward; elementwise ops, norms and the optimizer's update
count nothing (the usual "model FLOPs" of MFU). Per dtype class (``perf/peaks.py``): float32 math
is ``tf32`` where torch lets it run on tensor cores (``torch.backends.cuda.matmul.allow_tf32`` for
matmuls, ``torch.backends.cudnn.allow_tf32`` for convolutions, read at the counted step), else
``fp32``.

**Which step.** One step only: the counter is entered at the end of step ``c - 1`` and left at the
end of step ``c`` (the same interval the step clock times), ``c`` = the first step >= 2 (step 1 is
the warm-up) that the profiler window does not touch when a ``profile`` run arms one (its plan is
computed from the same options, ``_profile_plan.plan_window``), and before ``--steps``. The step-time
statistics leave step ``c`` out (``evidence/steps.py`` ``judged_steps``, ``evidence/profile.py``
``bare_clock``): the counter costs host time on every op of that step (see docs/yardstick.md for
the measured cost), not numerics (it reads shapes; the ops run unchanged).

**When it does not count** (event ``flops`` with ``status`` "skipped" and the ``reason``; the
metric is then absent, never estimated): torch.compile has compiled graphs in this process
(compiled kernels run outside the dispatcher the counter watches, and a dispatch mode would make
dynamo skip frames), or a model seen is set to compile and has not compiled yet (``Module.compile()``,
``torch.compile(model)``: its first compiled call would fall in the counted step, where torch 2.11's
dynamo compiled no graph and left the model eager for the rest of the run), the step runs on tensor subclasses (DTensor: their shapes are global, not
this rank's), the counter is not importable, or its dispatch mode is no longer the innermost one
at the end of the step (it is then left in place until it is, never popped from under the
script's own modes). ``status`` "not-reached": the run ended before (or inside) step ``c``.

Do no harm: no module hook, no tensor hook, no attribute on any user object (the counter's
module tracker, which registers global module hooks and gradient hooks, is replaced by a stub:
the per-module breakdown is not needed), no device sync. A formula that fails counts 0 and is
reported, never raised into the script.

Event ``flops`` {status, counted_step, entered, flops, flops_by_dtype, other_device_flops, by_op, device,
device_name, tf32, errors, reason}.

**Reuse (``treat``, before/after).** Arm the need ``flops`` for a run and read the metrics
provider: with the trials layer (``torchdoctor/trials``) that is
``Variation(..., needs=frozenset({"flops"}))`` for a trial (or ``"flops"`` added to the needs of
every trial run, baseline included), then ``pipeline.flops_metrics.flops_metrics(trial_run.evidence)``
per run: flops_per_step, achieved_flops_per_s, dtype, peak_flops_per_s, mfu (``metrics.flops``'s
keys, docs/json.md). ``TrialRun.step_ms`` reads ``judged_steps``, which already leaves the counted
step out, so the trial's step-time comparison is not disturbed. A probe arms it through
``EXTRA_NEEDS`` (``profile`` does). For a treated run where the counter cannot run (the
``compile`` trial: torch.compile in use), the FLOPs of the same model and batch are the
baseline's: ``flops_metrics_with(treated.evidence, baseline_flops_event, source="baseline's count")``
divides them by the treated run's own step time, and says so in ``source``. ``bf16-autocast`` and
``tf32`` change the dtype (and so the peak): count those, never borrow.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.instruments.base import Instrument, register

FIRST_STEP = 2  # the first step after the warm-up step
MAX_OPS = 8  # ops kept in ``by_op``
MAX_EXIT_TRIES = 8  # step ends at which a mode not on top is tried again


class _NoTracker:
    """Stands in for FlopCounterMode's module tracker: no global module or gradient hooks."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *a: Any) -> None:
        return None


def _dtype_class(torch: Any, dtype: Any, cuda: bool, conv: bool) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float32:
        if cuda:
            allow = torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32
            if allow:
                return "tf32"
        return "fp32"
    if dtype == torch.float64:
        return "fp64"
    if "float8" in str(dtype):
        return "fp8"
    return str(dtype).replace("torch.", "")


class _Tally:
    def __init__(self) -> None:
        self.by_dev: dict[str, dict[str, int]] = {}
        self.by_op: dict[str, int] = {}
        self.cuda_index: int | None = None
        self.subclass: str | None = None
        self.errors: list[str] = []


def counting_mapping(tally: _Tally) -> dict[Any, Any]:
    """``custom_mapping`` for FlopCounterMode: every registered formula, wrapped to tally the
    FLOPs by device, dtype class and op, and to count 0 (and note it) where a formula fails."""
    import torch
    from torch.utils.flop_counter import flop_registry

    plain = (torch.Tensor, torch.nn.Parameter)
    out = {}
    for packet, formula in flop_registry.items():
        name = str(packet).replace("aten.", "")
        conv = "conv" in name

        def wrapped(*args: Any, out_val: Any = None, _f=formula, _name=name, _conv=conv, **kwargs: Any):
            try:
                n = int(_f(*args, out_val=out_val, **kwargs))
            except Exception as e:  # noqa: BLE001 - a formula must never raise into the script
                if len(tally.errors) < 4:
                    tally.errors.append(f"{_name}: {type(e).__name__}: {e}"[:200])
                return 0
            t = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
            if t is None:
                return n
            if type(t) not in plain and tally.subclass is None:
                tally.subclass = type(t).__name__
            dev = t.device.type
            if dev == "cuda" and tally.cuda_index is None:
                tally.cuda_index = t.device.index
            cls = _dtype_class(torch, t.dtype, dev == "cuda", _conv)
            d = tally.by_dev.setdefault(dev, {})
            d[cls] = d.get(cls, 0) + n
            tally.by_op[_name] = tally.by_op.get(_name, 0) + n
            return n

        wrapped._get_raw = True  # called with the op's own arguments (no shape wrapper)
        out[packet] = wrapped
    return out


def make_counter(tally: _Tally) -> Any:
    """A ``FlopCounterMode`` (not entered) that tallies into ``tally``, prints nothing and
    installs no module tracker hooks."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=counting_mapping(tally))
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _NoTracker()
    return counter


def plan_step(options: dict[str, Any], profiled: bool) -> tuple[int | None, str | None]:
    """(the step to count, None) or (None, why no step fits)."""
    steps = int(options.get("steps") or 0)
    touched: set[int] = set()
    if profiled:
        from torchdoctor.instruments.profile._profile_plan import plan_window

        wait, warmup, active = plan_window(options)
        first = wait + warmup + 1  # first recorded step; wait is the budget's counted step
        touched = set(range(max(1, wait), first + active + 1))
    c = FIRST_STEP
    while c in touched:
        c += 1
    if steps and c >= steps:
        return None, (f"no step to count within --steps {steps}: step 1 is the warm-up"
                      + (", the profiler window takes steps "
                         f"{min(touched)}-{max(touched)}" if touched else "")
                      + " and the last step ends the run")
    return c, None


@register
class FlopCount(Instrument):
    name = "flop_count"
    produces = frozenset({"flops"})
    priority = 95  # last: enters after the other instruments' step-end work

    def install(self, ctx: Any) -> None:
        self.counter: Any = None
        self.tally: _Tally | None = None
        self.done = False
        self.exit_tries = 0
        self.entered = False
        profiled = ctx.probe == "profile" or any(k.startswith("profile_") for k in ctx.options)
        self.step, why = plan_step(ctx.options, profiled)
        if self.step is None:
            self._finish(ctx, "skipped", reason=why)

    def _finish(self, ctx: Any, status: str, **fields: Any) -> None:
        self.done = True
        # entered: the counter ran during step ``counted_step`` (its time is not a plain step's)
        ctx.emit("flops", status=status, counted_step=self.step, entered=self.entered, **fields)

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.done or not ctx.in_owner_thread():
            return
        if self.counter is None and step == self.step - 1:
            self._enter(ctx)
        elif self.counter is not None and step >= self.step:
            self._leave(ctx, step)

    def _enter(self, ctx: Any) -> None:
        from torchdoctor.torch_internals import dynamo_graphs_compiled

        pending = _compile_pending(ctx)
        if pending:
            self._finish(ctx, "skipped", reason=(
                f"{pending} is set to compile and has not compiled yet: under the counter's "
                "dispatch mode dynamo would run it eager for the rest of the run (seen with "
                "torch 2.11: treat's compile trial on llm.c compiled no graph)"))
            return
        graphs = dynamo_graphs_compiled()
        if graphs is None or graphs > 0:
            self._finish(ctx, "skipped", reason=(
                "torch.compile is in use: compiled kernels run outside the dispatcher the FLOP "
                "counter watches, so a count would miss them" if graphs else
                "this torch keeps no count of compiled graphs: a count could miss compiled kernels"))
            return
        self.tally = _Tally()
        try:
            counter = make_counter(self.tally)
        except ImportError as e:
            self._finish(ctx, "skipped", reason=f"torch's FLOP counter is not importable: {e}")
            return
        counter.__enter__()
        self.counter = counter
        self.entered = True

    def _leave(self, ctx: Any, step: int) -> None:
        from torchdoctor.torch_internals import current_dispatch_mode

        if current_dispatch_mode() is not getattr(self.counter, "mode", None):
            self.exit_tries += 1
            if self.exit_tries >= MAX_EXIT_TRIES:
                # left in place: popping it would pop the script's own mode
                self._finish(ctx, "skipped", reason="the script's own dispatch mode was still "
                             "active above the counter")
            return
        self.counter.__exit__(None, None, None)
        counter, self.counter = self.counter, None
        if step != self.step:
            self._finish(ctx, "skipped", reason=f"the counter could only be left at step {step}")
            return
        self._emit(ctx, counter)

    def _emit(self, ctx: Any, counter: Any) -> None:
        t = self.tally
        if t.subclass:
            self._finish(ctx, "skipped", reason=f"the step computes on tensor subclasses ({t.subclass}): "
                         "their shapes are not the shapes this process computes")
            return
        dev = max(t.by_dev, key=lambda d: sum(t.by_dev[d].values())) if t.by_dev else "cpu"
        by_dtype = t.by_dev.get(dev, {})
        other = sum(sum(v.values()) for d, v in t.by_dev.items() if d != dev)
        name = None
        tf32 = None
        if dev == "cuda":
            import torch

            try:
                name = torch.cuda.get_device_name(t.cuda_index)
            except Exception:  # noqa: BLE001
                name = None
            tf32 = {"matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                    "conv": bool(torch.backends.cudnn.allow_tf32)}
        top = dict(sorted(t.by_op.items(), key=lambda kv: -kv[1])[:MAX_OPS])
        self._finish(ctx, "ok", flops=int(counter.get_total_flops()), flops_by_dtype=by_dtype,
                     other_device_flops=other, by_op=top, device=dev, device_name=name, tf32=tf32,
                     errors=t.errors, counter="torch.utils.flop_counter.FlopCounterMode")

    def uninstall(self, ctx: Any) -> None:
        if self.done:
            return
        if self.counter is not None:
            from torchdoctor.torch_internals import current_dispatch_mode

            if current_dispatch_mode() is getattr(self.counter, "mode", None):
                self.counter.__exit__(None, None, None)
            self.counter = None
            self._finish(ctx, "not-reached", reason=f"the run ended inside step {self.step}, the counted step")
            return
        self._finish(ctx, "not-reached", reason=f"the run ended before step {self.step}, the counted step")


def _compile_pending(ctx: Any) -> str | None:
    """The class name of a model seen that is set to compile (``Module.compile()`` in place, or
    ``torch.compile(model)``'s wrapper), when dynamo has compiled nothing yet; else None."""
    from torchdoctor.instruments.dynamo._counts import dynamo_counts

    counts = dynamo_counts()
    if counts is not None and counts["graphs"] > 0:
        return None  # compiled already: the graphs check says why the count is skipped
    try:
        models = ctx.models()
    except Exception:  # noqa: BLE001
        return None
    for m in models:
        if getattr(m, "_compiled_call_impl", None) is not None or hasattr(m, "_orig_mod"):
            return type(m).__name__
    return None
