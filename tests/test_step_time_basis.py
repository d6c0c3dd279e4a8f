"""One notion of step time on CUDA (GPU-truth issue): the longer of host wall and device span,
phase shares by device time when the GPU is the bottleneck, and the CPU reports unchanged."""

from __future__ import annotations

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.evidence.steps import CUDA_BASIS, step_seconds, step_summary


def _steps(n, host_ms, phases=None):
    ph = phases or {}
    return [{"kind": "step", "step": i, "wall_s": host_ms / 1e3,
             **{f"{p}_s": v / 1e3 for p, v in ph.items()}} for i in range(1, n + 1)]


def _dev(n, span, fwd, bwd, opt):
    return [{"kind": "step_device", "step": i, "device": 0, "span_ms": span if i > 1 else None,
             "forward_ms": fwd, "backward_ms": bwd, "optimizer_ms": opt, "busy": 1.0}
            for i in range(1, n + 1)]


def test_a_cpu_run_keeps_its_report_keys_and_host_wall():
    m = step_summary(Evidence.from_events(_steps(6, 10.0, {"forward": 4, "backward": 5})))
    assert m["median_step_ms"] == pytest.approx(10.0)
    assert "step_time_basis" not in m and "share_basis" not in m and "device" not in m


def test_the_host_blocking_in_the_optimizer_does_not_make_it_the_dominant_phase():
    # regression (H200, fp32 MLP with foreach AdamW): the host blocked in optimizer.step (78 ms
    # host) while CUDA events gave forward 39, backward 68, optimizer 5.1 of a 113 ms step; the
    # share column said "optimizer 80%"
    ev = Evidence.from_events(_steps(10, 113.0, {"forward": 14.0, "backward": 20.0, "optimizer": 78.0})
                              + _dev(10, 113.0, 39.0, 68.0, 5.1))
    m = step_summary(ev)
    assert m["step_time_basis"] == CUDA_BASIS and m["share_basis"] == "device"
    assert m["share"]["backward"] == pytest.approx(68 / 113, abs=1e-3)
    assert m["share"]["forward"] == pytest.approx(39 / 113, abs=1e-3)
    assert m["share"]["optimizer"] < 0.05
    assert m["host_share"]["optimizer"] > 0.6  # both columns kept
    assert max(m["share"], key=m["share"].get) == "backward"


def test_a_host_bound_gpu_step_keeps_host_shares():
    # a data-bound loop: the GPU idles most of the step; the host's data wait is the story
    ev = Evidence.from_events(_steps(10, 100.0, {"data": 90.0, "forward": 3.0, "backward": 4.0})
                              + _dev(10, 100.0, 2.0, 3.0, 0.5))
    m = step_summary(ev)
    assert m["share_basis"] == "host" and m["device"]["bound"] == "host"
    assert m["share"]["data"] == pytest.approx(0.9, abs=1e-3)
    assert m["device"]["busy_share"] == pytest.approx(0.055, abs=1e-3)


def test_a_host_blocking_unevenly_is_timed_by_the_span_not_the_longer_of_the_two():
    # measured on the H200 (fp32 MLP, foreach AdamW): the host blocked in alternate steps (walls
    # of ~40 and ~150 ms) around a steady 95 ms device period; max(host, span) per step read 1.28x
    # the script's own synchronised time, the spans 1.00x
    steps = [{"kind": "step", "step": i, "wall_s": (0.040 if i % 2 else 0.150)} for i in range(1, 11)]
    ev = Evidence.from_events(steps + _dev(10, 95.0, 34.0, 56.0, 5.0))
    m = step_summary(ev)
    assert m["median_step_ms"] == pytest.approx(95.0) and m["mean_step_ms"] == pytest.approx(95.0)
    times, _ = step_seconds(ev, ev.of("step")[1:])
    assert sum(times) / len(times) == pytest.approx(0.095)


def test_a_host_running_ahead_is_timed_by_the_device_span():
    ev = Evidence.from_events(_steps(10, 7.0, {"forward": 2.0, "backward": 3.0, "optimizer": 1.0})
                              + _dev(10, 111.0, 38.0, 68.0, 4.0))
    m = step_summary(ev)
    assert m["median_step_ms"] == pytest.approx(111.0) and m["host_mean_step_ms"] == pytest.approx(7.0)
    assert m["series"]["wall_ms"][1:] == [111.0] * 9  # the plot follows the same basis
    times, basis = step_seconds(ev, ev.of("step"))
    assert times[0] == pytest.approx(0.007) and basis == CUDA_BASIS  # step 1: no span read


def test_the_console_table_shows_both_columns_and_says_which_basis():
    from rich.console import Console

    from torchdoctor.findings import Report
    from torchdoctor.report.sections.steps import step_breakdown

    ev = Evidence.from_events(_steps(10, 7.0, {"forward": 2.0, "backward": 3.0, "optimizer": 1.0})
                              + _dev(10, 111.0, 38.0, 68.0, 4.0))
    r = Report(command="checkup")
    r.metrics["steps"] = step_summary(ev)
    con = Console(width=160, record=True)
    con.print(step_breakdown(r))
    out = " ".join(con.export_text().split())
    assert "host share" in out and "GPU share" in out and "GPU ms" in out
    assert "bars by GPU time" in out and "the host's own wall: 7 ms" in out


def test_a_kept_loss_never_holds_the_loss_buffer():
    # regression (H200, treat baseline): the trial trace kept loss.detach() per step; mse_loss's
    # 0-d result is a view of the whole elementwise buffer (16 MiB a step there), so treat
    # created a memory-growth error and blamed the user's loss line
    import torch

    from torchdoctor.numerics.tensors import kept_scalar

    x = torch.randn(512, 512, requires_grad=True)
    loss = torch.nn.functional.mse_loss(x, torch.zeros(512, 512))
    assert loss.untyped_storage().nbytes() > 1024  # the torch behaviour the fix is about
    k = kept_scalar(loss)
    assert k.untyped_storage().nbytes() <= 8 and float(k) == float(loss) and not k.requires_grad
    own = torch.tensor(3.0)
    assert kept_scalar(own).untyped_storage().data_ptr() == own.untyped_storage().data_ptr()  # no copy


def test_the_trial_trace_and_the_nan_monitor_keep_no_loss_buffer():
    import torch

    from torchdoctor.instruments.testing import RecordingContext
    from torchdoctor.instruments.trials.trial_trace import TrialTrace

    x = torch.randn(256, 256, requires_grad=True)
    loss = torch.nn.functional.mse_loss(x, torch.zeros(256, 256))
    ctx = RecordingContext()
    ctx.last_backward_tensor = loss
    tt = TrialTrace()
    tt.install(ctx)
    for step in range(1, 4):
        tt.on_backward_begin(ctx)
        tt.on_step_end(ctx, step)
    assert all(t.untyped_storage().nbytes() <= 8 for _s, t in tt.kept)


def test_a_forward_the_clock_never_saw_is_not_shown_as_zero():
    # measured on the H200: a torch.compile'd model's forward runs without module hooks; the
    # table showed "forward 0%" with its time in other
    ev = Evidence.from_events(_steps(10, 19.5, {"forward": 0.0, "backward": 11.0, "optimizer": 1.0})
                              + _dev(10, 19.5, 0.0, 11.3, 1.0))
    m = step_summary(ev)
    assert "torch.compile" in m["forward_unseen"] and "forward_ms" not in m["device"]
    from rich.console import Console

    from torchdoctor.findings import Report
    from torchdoctor.report.sections.steps import step_breakdown

    r = Report(command="checkup")
    r.metrics["steps"] = m
    con = Console(width=160, record=True)
    con.print(step_breakdown(r))
    out = " ".join(con.export_text().split())
    assert "forward not seen" in out and "forward 0 " not in out
    # a CPU report keeps its keys
    assert "forward_unseen" not in step_summary(Evidence.from_events(_steps(6, 10.0, {"backward": 5})))


def test_a_ranks_step_median_is_on_the_same_basis():
    # dist / ranked runs: the per-rank step time is the device span where one was read
    from torchdoctor.distributed.stragglers import rank_spans, step_medians

    steps = [{"kind": "step", "rank": 0, "step": i, "wall_s": 0.007} for i in range(1, 8)]
    devs = [{"kind": "step_device", "rank": 0, "step": i, "span_ms": 111.0} for i in range(2, 8)]
    sp = rank_spans(steps + devs)
    assert step_medians(steps, sp.get(0))["median_step_s"] == pytest.approx(0.111)
    assert step_medians(steps)["median_step_s"] == pytest.approx(0.007)  # CPU: the host wall


def test_the_memory_site_window_steps_are_left_out_of_a_cuda_runs_step_figures():
    # measured on the H200 (host-sync loop under checkup): the site window armed at step 35 and
    # its steps took 158, 54, 30 and 32 ms against 10 ms; the mean step read 1.6x the median
    from torchdoctor.evidence.steps import judged_steps

    steps = _steps(38, 10.0, {"forward": 3.0, "backward": 5.0})
    for s in steps[34:]:
        s["wall_s"] = 0.150
    dev = _dev(38, 10.0, 3.0, 5.0, 1.0)
    for d in dev[34:]:
        d["span_ms"] = 150.0
    sites = [{"kind": "mem_sites", "steps": [35, 38], "reason": "host heap rising"}]
    m = step_summary(Evidence.from_events(steps + dev + sites))
    assert m["mean_step_ms"] == pytest.approx(10.0) and m["judged"] == 33
    # a CPU report keeps its judged steps (its figures unchanged)
    cpu = Evidence.from_events(steps + sites)
    assert len(judged_steps(cpu)) == 37


def test_the_device_columns_leave_out_the_same_site_window_steps():
    # measured on the H200 (gpu_truth, hostsync under checkup, session 9): the site window's four
    # steps spent ~10x the step on the device and turned a host-bound loop's device summary to
    # "bound: device" (busy share 1.0) and its optimizer to 1.9 ms, while the step figures beside
    # it had already left those steps out: both now describe the same steps
    steps = _steps(38, 10.0, {"forward": 3.0, "backward": 5.0})
    dev = _dev(38, 10.0, 3.0, 5.0, 1.0)
    for s, d in zip(steps[34:], dev[34:]):
        s["wall_s"] = 0.150
        d.update(span_ms=150.0, optimizer_ms=120.0, busy=1.0)
    sites = [{"kind": "mem_sites", "steps": [35, 38], "reason": "host heap rising"}]
    m = step_summary(Evidence.from_events(steps + dev + sites))
    assert m["site_window_steps_skipped"] == [35, 36, 37, 38]
    assert m["device"]["steps"] == 33 and m["device"]["optimizer_ms"] == pytest.approx(1.0)
    assert m["device"]["span_ms"] == pytest.approx(10.0)
    # without the window every step is in both
    plain = step_summary(Evidence.from_events(steps[:34] + dev[:34]))
    assert "site_window_steps_skipped" not in plain and plain["device"]["steps"] == 33


def test_profiles_own_window_steps_are_left_out_of_the_step_figures_on_every_device():
    # measured on the H200 (profile on the profile fixture's MLP, session 10): 6.3 ms a step
    # plainly, the run's mean read 11.4 ms with the profiler's steps in it (median 6.1); on the
    # 2-core CPU box 37.8 ms mean against 30.6 ms per un-profiled step
    window = [{"kind": "profile_window", "status": "ok", "wait": 5, "warmup": 1, "active": 3}]
    steps = _steps(20, 6.0, {"forward": 2.0, "backward": 3.0})
    dev = _dev(20, 6.0, 2.0, 3.0, 0.5)
    for s, d in zip(steps[4:10], dev[4:10]):  # steps 5-10: call count, warm-up, 3 recorded, export
        s["wall_s"] = 0.060
        d.update(span_ms=60.0, busy=1.0)
    for events in (steps + dev + window, steps + window):  # CUDA, CPU
        m = step_summary(Evidence.from_events(events))
        assert m["profiler_window_steps_skipped"] == [5, 6, 7, 8, 9, 10]
        assert m["judged"] == 13 and m["mean_step_ms"] == pytest.approx(6.0)
    assert step_summary(Evidence.from_events(steps + dev + window))["device"]["steps"] == 13
    # a window that never ran (unavailable: no wait/warm-up/active) leaves every step in
    gone = [{"kind": "profile_window", "status": "unavailable", "reason": "another profiler"}]
    assert "profiler_window_steps_skipped" not in step_summary(Evidence.from_events(steps + gone))
    # a run too short to have other steps keeps them (the figures are then the profiled steps')
    early = [{"kind": "profile_window", "status": "ok", "wait": 1, "warmup": 1, "active": 3}]
    short = step_summary(Evidence.from_events(steps[:6] + early))
    assert short["judged"] == 5 and "profiler_window_steps_skipped" not in short


def test_the_step_title_says_which_steps_torchdoctor_left_out():
    from rich.console import Console

    from torchdoctor.findings import Report
    from torchdoctor.report.sections.steps import step_breakdown

    window = [{"kind": "profile_window", "status": "ok", "wait": 5, "warmup": 1, "active": 3}]
    r = Report(command="profile", target="x.py")
    r.metrics["steps"] = step_summary(Evidence.from_events(_steps(20, 6.0) + window))
    con = Console(width=200, record=True)
    con.print(step_breakdown(r))
    assert ("13 steps, first 1 left out as warm-up and 6 slowed by the profiler window"
            in " ".join(con.export_text().split()))
