"""Step-clock summaries, shared by the rules and the metrics ``steps`` and ``run``
(``pipeline/steps_metrics.py``): derived views of the evidence, below both.

Warm-up: the first step (lazy init, worker start-up, allocator growth, cuDNN autotune) is left
out of the summary when at least WARMUP_MIN_STEPS steps were seen.

One statistic: the step time and its phases are **means** over the judged steps (``mean_ms``,
``mean_step_ms``, ``share`` = phase total / wall total), so the phases add up to the step and
the shares to 100%. Medians of phases do not add up (the median step is rarely the step with
the median data wait); the median and p90 step times are kept beside, labelled, to show spread.
The GPU column (``device``) is also a mean per phase; ``busy`` stays the median share (a
robust estimate, used by the rules as an upper bound).

**Step time on CUDA** (one notion for every command: :func:`step_seconds`). The host runs ahead
of the GPU and blocks wherever the launch queue fills, so a step's host wall time is not its
time: a step's time is the longer of its host wall and its device span (the time between the
CUDA events recorded at the previous and at this step end). ``step_time_basis`` names the basis
("host wall" on a CPU, or on CUDA when no device span was read). The **phase shares** are then
taken by device time when the device is the bottleneck (GPU busy >= ``DEVICE_BOUND_BUSY`` of the
step) and by host time otherwise (data wait, launch-bound, host syncs): ``share_basis`` says
which; ``host_share`` and ``device.share`` keep both.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.evidence import CUDA_BASIS, HOST_BASIS, Evidence, device_spans, step_seconds  # noqa: F401

PHASES = ("data", "forward", "backward", "optimizer", "other")
SERIES_MAX = 2000  # points of the per-step series kept in the report (every k-th step beyond)
WARMUP_STEPS = 1
WARMUP_MIN_STEPS = 3
DEVICE_BOUND_BUSY = 0.9  # GPU busy share from which the phase shares are by device time


def counted_steps(ev: Evidence) -> set[int]:
    """Steps run under the FLOP counter (``instruments/perf/flop_count.py``): slower by its cost."""
    return {int(e["counted_step"]) for e in ev.of("flops")
            if e.get("entered") and e.get("counted_step") is not None}


def site_window_steps(ev: Evidence) -> set[int]:
    """Steps the memory sampler's allocation-site window ran in (``mem_sites`` {steps: [a, b]}):
    tracemalloc and the allocation tracker slow every op there (3-15x the step on a host-bound
    GPU loop, measured on the H200 truth harness). Left out of the step figures of CUDA runs
    (a CPU report keeps its judged steps: its figures are unchanged)."""
    if not ev.of("step_device"):
        return set()
    out: set[int] = set()
    for e in ev.of("mem_sites"):
        st = e.get("steps")
        if isinstance(st, list) and len(st) == 2 and all(isinstance(x, int) for x in st):
            out |= set(range(st[0], st[1] + 1))
    return out


def profiler_window_steps(ev: Evidence) -> set[int]:
    """Steps ``profile``'s own torch.profiler window slowed (``profile_window`` {wait, warmup,
    active}): the step whose Python calls are counted to plan the window (step ``wait``), the
    profiler's warm-up and recorded steps, and the step after them, whose boundary exports and
    analyses the trace. Measured on an H200 (profile fixture MLP, 6.3 ms plain): the run's mean
    step read 11.4 ms with them, its median 6.1 ms; on the 2-core CPU box the same cost shows as
    37.8 ms mean against 30.6 ms per un-profiled step. Left out of the step figures on every device
    (the window's own analysis reports the recorded steps)."""
    out: set[int] = set()
    for e in ev.of("profile_window"):
        w, wu, a = e.get("wait"), e.get("warmup"), e.get("active")
        if e.get("status") not in ("ok", "partial", "empty") or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in (w, wu, a)):
            continue
        out |= set(range(max(1, w), w + wu + a + 2))
    return out


def perturbed_steps(ev: Evidence) -> set[int]:
    """Every step torchdoctor's own measurement slowed: the FLOP counter's, the memory site
    window's (CUDA), the profiler window's."""
    return counted_steps(ev) | site_window_steps(ev) | profiler_window_steps(ev)


def judged_steps(ev: Evidence) -> list[dict[str, Any]]:
    """The step events the rules judge: all but the warm-up step(s) when there are enough, and
    but the steps torchdoctor's own measurement slowed (the FLOP counter's step; on CUDA the
    memory sampler's site window; profile's own profiler window) when other steps are left."""
    steps = ev.of("step")
    if len(steps) >= WARMUP_MIN_STEPS:
        steps = steps[WARMUP_STEPS:]
    perturbed = perturbed_steps(ev)
    if perturbed:
        plain = [s for s in steps if s.get("step") not in perturbed]
        steps = plain or steps
    return steps


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return 0.0
    k = min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))
    return v[k]


def step_summary(ev: Evidence) -> dict[str, Any] | None:
    steps = judged_steps(ev)
    if not steps:
        return None
    walls, basis = step_seconds(ev, steps)
    host_total = sum(float(s["wall_s"]) for s in steps) or 1e-12
    total = sum(walls) or 1e-12
    sums = {p: sum(float(s.get(f"{p}_s", 0.0)) for s in steps) for p in PHASES}
    # phases that nest (a closure optimizer such as LBFGS runs forward and backward inside
    # optimizer.step) count one interval twice: shares are then taken of the phase total, so
    # they still add up to 100%, and the overlap is reported
    overlap = sum(sums.values()) - host_total
    denom = host_total + max(0.0, overlap)
    out: dict[str, Any] = {
        "count": len(ev.of("step")),
        "judged": len(steps),
        "warmup_skipped": WARMUP_STEPS if len(ev.of("step")) >= WARMUP_MIN_STEPS else 0,
        "source": steps[-1].get("source"),
        "median_step_ms": round(statistics.median(walls) * 1e3, 3),
        "mean_step_ms": round(total / len(steps) * 1e3, 3),
        "p90_step_ms": round(_pct(walls, 0.9) * 1e3, 3),
        "share": {p: round(sums[p] / denom, 4) for p in PHASES},
        "mean_ms": {p: round(sums[p] / len(steps) * 1e3, 3) for p in PHASES},
        "batches_per_step": round(sum(int(s.get("batches", 0)) for s in steps) / len(steps), 3),
        "backwards_per_step": round(sum(int(s.get("backwards", 0)) for s in steps) / len(steps), 3),
    }
    # the steps a perturbation left out: seen, not the warm-up, not judged
    seen = {s.get("step") for s in ev.of("step")[out["warmup_skipped"]:]} - {s.get("step") for s in steps}
    left_out = sorted(counted_steps(ev) & seen)
    if left_out:  # the FLOP counter's step: not a plain step (docs/yardstick.md)
        out["flop_count_step_skipped"] = left_out
    sites_out = sorted(site_window_steps(ev) & seen)
    if sites_out:  # CUDA runs: the memory sampler's allocation-site window slowed these steps
        out["site_window_steps_skipped"] = sites_out
    prof_out = sorted(profiler_window_steps(ev) & seen)
    if prof_out:  # profile: its own torch.profiler window slowed these steps
        out["profiler_window_steps_skipped"] = prof_out
    if overlap > 0.01 * host_total:
        out["phase_overlap_ms"] = round(overlap / len(steps) * 1e3, 3)
    if sums["forward"] == 0.0 and sums["backward"] > 0.0 and ev.of("step_device"):
        # no root forward was seen (a torch.compile'd model runs without module hooks, a model
        # called through a function the hooks do not see): its time is in "other", not zero
        # (said on CUDA runs, whose table has the GPU columns; a CPU report keeps its keys)
        out["forward_unseen"] = ("no model forward was seen by the step clock (torch.compile runs "
                                 "the model without module hooks): the forward's time is in other")
    dev = device_summary(ev)
    if dev:  # a CUDA run (a CPU report keeps its keys: the basis there is the host wall)
        out["step_time_basis"] = basis
        out["host_mean_step_ms"] = round(host_total / len(steps) * 1e3, 3)
        _device_shares(dev, total / len(steps) * 1e3, bool(out.get("forward_unseen")))
        out["device"] = dev
        out["host_share"] = dict(out["share"])
        out["share_basis"] = "host"
        if dev.get("bound") == "device":
            out["share"] = dict(dev["share"])
            out["share_basis"] = "device"
    all_steps = ev.of("step")
    out["series"] = step_series(all_steps, step_seconds(ev, all_steps)[0])
    return out


def _device_shares(dev: dict[str, Any], step_ms: float, unseen_forward: bool = False) -> None:
    """Device shares of the step (forward/backward/optimizer from CUDA events; ``other`` is the
    rest of the step: data, copies, the host's gaps) and whether the device is the bottleneck:
    its phases fill >= DEVICE_BOUND_BUSY of the step time."""
    if step_ms <= 0:
        return
    ph = {p: float(dev.get(f"{p}_ms") or 0.0) for p in ("forward", "backward", "optimizer")}
    if unseen_forward:
        dev.pop("forward_ms", None)
    busy_ms = sum(ph.values())
    denom = max(step_ms, busy_ms)
    share = {"data": 0.0, **{p: round(v / denom, 4) for p, v in ph.items()}}
    share["other"] = round(max(0.0, 1.0 - sum(share.values())), 4)
    dev["share"] = share
    dev["busy_share"] = round(busy_ms / denom, 4)
    dev["bound"] = "device" if busy_ms / denom >= DEVICE_BOUND_BUSY else "host"


def step_series(steps: list[dict[str, Any]], times: list[float] | None = None) -> dict[str, list]:
    """Step time (``times``, seconds, by the step-time basis; else the host wall) and data wait
    per step (ms), warm-up included, for plots (the HTML report): at most SERIES_MAX points,
    every k-th step beyond that (the last one kept)."""
    k = max(1, -(-len(steps) // SERIES_MAX))
    idx = list(range(0, len(steps), k))
    if steps and (len(steps) - 1) % k:
        idx.append(len(steps) - 1)
    picked = [steps[i] for i in idx]
    t = times if times is not None and len(times) == len(steps) else [float(s["wall_s"]) for s in steps]
    return {"step": [int(s["step"]) for s in picked],
            "wall_ms": [round(t[i] * 1e3, 3) for i in idx],
            "data_ms": [round(float(s.get("data_s", 0.0)) * 1e3, 3) for s in picked]}


def device_summary(ev: Evidence) -> dict[str, Any] | None:
    """Means of the CUDA-event phase times and the median busy estimate (after warm-up)."""
    devs = ev.of("step_device")
    if len(devs) >= WARMUP_MIN_STEPS:
        devs = devs[WARMUP_STEPS:]
    # the same steps as the step figures: not the FLOP counter's, not the memory site window's
    perturbed = perturbed_steps(ev)
    devs = [d for d in devs if d.get("step") not in perturbed] or devs
    if not devs:
        return None
    out: dict[str, Any] = {"steps": len(devs)}
    for k in ("forward_ms", "backward_ms", "optimizer_ms", "span_ms", "busy"):
        vals = [float(d[k]) for d in devs if d.get(k) is not None]
        if vals:  # phase times: means (they add up, as the host columns); busy: the median
            out[k] = round(statistics.median(vals) if k == "busy" else statistics.fmean(vals), 4)
    return out
