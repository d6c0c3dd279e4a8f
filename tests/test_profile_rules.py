"""The profile rules on synthetic evidence: thresholds, healthy silence, 'not applicable' reasons."""

from __future__ import annotations

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.instruments.profile.profiler_window import plan_window
from torchdoctor.judge import NotApplicable, judge
from torchdoctor.rules import profile as R

WINDOW = {"kind": "profile_window", "status": "ok", "wait": 5, "warmup": 1, "active": 3, "first_step": 7,
          "active_steps": 3, "steps": [7, 8, 9], "cuda": True,
          "device": {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},
          "flags": {"matmul_allow_tf32": False, "cudnn_allow_tf32": True}}


def steps(wall_ms=10.0, data_ms=0.0, n=20, profiled_ms=None):
    out = []
    for i in range(1, n + 1):
        w = wall_ms if not (6 <= i <= 10) or profiled_ms is None else profiled_ms
        out.append({"kind": "step", "step": i, "wall_s": w / 1e3, "data_s": data_ms / 1e3})
    return out


def ev(*events, window=None, step_events=None):
    w = dict(WINDOW, **(window or {}))
    return Evidence.from_events([*(step_events if step_events is not None else steps()), w, *events])


def device(busy_ms, kernels=200.0, median_us=2.0):
    return {"kind": "profile_device", "gpu_busy_ms": busy_ms, "kernels_per_step": kernels,
            "median_kernel_us": median_us, "kernel_ms": busy_ms, "device_events": 10}


def codes(e: Evidence) -> set[str]:
    r = Report("profile")
    judge("profile", e, r)
    return {f.code for f in r.findings}


# --------------------------------------------------------------------------- window and clock

def test_plan_window_fits_short_runs():
    assert plan_window({}) == (5, 1, 3)
    assert plan_window({"steps": 20}) == (5, 1, 3)
    assert plan_window({"steps": 6}) == (2, 1, 3)
    assert plan_window({"steps": 3}) == (0, 1, 2)
    assert plan_window({"steps": 0, "profile_skip": 12, "profile_active": 5}) == (12, 1, 5)


def test_missing_or_unreached_window_is_not_applicable_with_the_reason():
    with pytest.raises(NotApplicable, match="did not run"):
        R.window(Evidence.from_events(steps()))
    e = Evidence.from_events([{"kind": "profile_window", "status": "not-reached", "steps_seen": 4,
                               "steps_needed": 9}])
    with pytest.raises(NotApplicable, match="completed 4 training steps; .* needs 9"):
        R.window(e)
    r = Report("profile")
    judge("profile", e, r)
    assert {s.rule for s in r.skipped} >= {"launch-bound", "host-sync-in-loop", "slow-python-loop"}


def test_an_empty_window_is_not_judged():
    e = Evidence.from_events([*steps(), {"kind": "profile_window", "status": "empty",
                                         "reason": "the profiler recorded no torch op"}])
    with pytest.raises(NotApplicable, match="no torch op"):
        R.slow_python_loop(e)


def test_a_failed_window_is_an_internal_error_not_a_quiet_skip():
    e = Evidence.from_events([{"kind": "profile_window", "status": "failed", "error": "KeyError: 'x'",
                               "traceback": "tb"}])
    r = Report("profile")
    judge("profile", e, r)
    assert [f.code for f in r.findings] == ["internal-error"]
    assert "KeyError" in r.findings[0].title


def test_bare_clock_leaves_out_the_steps_the_profiler_touched():
    e = ev(step_events=steps(wall_ms=4.0, profiled_ms=50.0))
    clock = R.bare_clock(e, R.window(e))
    assert clock["step_ms"] == pytest.approx(4.0)
    assert clock["source"] == "bare"
    from torchdoctor.evidence.profile import touched_steps

    assert touched_steps(WINDOW) == {6, 7, 8, 9, 10}


def test_gpu_rules_need_cuda_work():
    cpu = ev(window={"cuda": False})
    with pytest.raises(NotApplicable, match="needs CUDA"):
        R.launch_bound(cpu)
    with pytest.raises(NotApplicable, match="no GPU work"):
        R.host_sync_in_loop(ev())


# --------------------------------------------------------------------------- launch-bound

def test_launch_bound_when_gpu_idles_and_data_is_ready():
    e = ev(device(busy_ms=2.0))
    (f,) = R.launch_bound(e)
    assert f.code == "launch-bound"
    assert f.evidence["gpu_busy_share"] == pytest.approx(0.2)
    assert "20%" in f.title and "200 kernels" in f.title


def test_launch_bound_silent_when_busy_or_data_bound():
    assert R.launch_bound(ev(device(busy_ms=6.0))) == []
    data_bound = ev(device(busy_ms=2.0), step_events=steps(wall_ms=10.0, data_ms=5.0))
    assert R.launch_bound(data_bound) == []


# --------------------------------------------------------------------------- host-sync-in-loop

def sync_ev(per_step):
    return ev(device(8.0), {"kind": "profile_syncs", "per_step": per_step, "wait_ms": 0.5,
                            "sites": [{"site": "train.py:21", "code": "losses.append(loss.item())",
                                       "per_step": 1.0, "ops": ["aten::_local_scalar_dense"]}],
                            "excluded": {"h2d_copy": 3}})


def test_host_sync_every_step_is_found_with_the_line():
    (f,) = R.host_sync_in_loop(sync_ev([1, 2, 1]))
    assert "train.py:21" in f.title and "loss.item()" in f.title
    assert f.evidence["syncs_per_step"] == pytest.approx(4 / 3)
    assert f.evidence["not_counted"] == {"h2d_copy": 3}


def test_a_sync_that_skips_a_step_is_not_every_step():
    assert R.host_sync_in_loop(sync_ev([1, 0, 1])) == []


# --------------------------------------------------------------------------- pageable-h2d-copy

def copies_ev(bytes_per_step, ms=0.01):
    return ev(device(8.0), {"kind": "profile_copies", "pageable_h2d_per_step": [1, 1, 1],
                            "pageable_h2d_bytes_per_step": [bytes_per_step] * 3, "pageable_h2d_ms": ms,
                            "pageable_sites": [{"site": "train.py:17", "bytes_per_step": bytes_per_step}]},
              {"kind": "dataloader", "pin_memory": False})


def test_pageable_copies_above_the_floor_warn():
    (f,) = R.pageable_h2d_copy(copies_ev(16 << 20, ms=2.0))
    assert "16.0 MiB per step" in f.title and "train.py:17" in f.title
    assert f.evidence["dataloader_pin_memory"] == [False]


def test_small_pageable_copies_stay_silent():
    assert R.pageable_h2d_copy(copies_ev(4096, ms=0.005)) == []
    # a small copy that still eats a visible share of the step is reported
    assert R.pageable_h2d_copy(copies_ev(4096, ms=0.5))


# --------------------------------------------------------------------------- fp32-compute-bound

def gemm_ev(fp32_ms, busy_ms=9.0, cap=(9, 0)):
    return ev(device(busy_ms), {"kind": "profile_gemm", "fp32_plain_ms": fp32_ms, "mm_conv_ms": fp32_ms,
                                "mm_conv_by_dtype_ms": {"float32": fp32_ms}, "fp32_ops": [],
                                "fp32_kernels": []},
              window={"device": {"name": "gpu", "capability": list(cap)}})


def test_fp32_dominating_a_busy_gpu_warns():
    (f,) = R.fp32_compute_bound(gemm_ev(6.0))
    assert f.evidence["fp32_gemm_share_of_gpu_time"] == pytest.approx(6 / 9, abs=1e-3)


def test_fp32_rule_silent_below_share_or_on_an_idle_gpu_and_skips_old_gpus():
    assert R.fp32_compute_bound(gemm_ev(3.0)) == []
    assert R.fp32_compute_bound(gemm_ev(2.0, busy_ms=3.0)) == []  # launch-bound, not compute-bound
    with pytest.raises(NotApplicable, match="bf16 tensor cores"):
        R.fp32_compute_bound(gemm_ev(6.0, cap=(7, 5)))


# --------------------------------------------------------------------------- slow-python-loop

def host_ev(ops_ms, wall_ms=10.0, data_ms=0.0):
    return ev({"kind": "profile_host", "ops_ms": ops_ms, "profiled_step_ms": wall_ms * 1.5},
              {"kind": "profile_python", "functions": [{"def": "train.py:12", "func": "make_features",
                                                         "self_ms": 6.0}]},
              window={"cuda": False}, step_events=steps(wall_ms=wall_ms, data_ms=data_ms))


def test_slow_python_loop_when_python_dominates_a_cpu_step():
    (f,) = R.slow_python_loop(host_ev(ops_ms=2.0))
    assert f.severity == "info"
    assert f.evidence["python_share"] == pytest.approx(0.8)
    assert "make_features at train.py:12" in f.title


def test_slow_python_loop_silent_when_ops_or_data_dominate():
    assert R.slow_python_loop(host_ev(ops_ms=6.0)) == []
    assert R.slow_python_loop(host_ev(ops_ms=2.0, data_ms=6.0)) == []


def test_slow_python_loop_leaves_gpu_runs_to_launch_bound():
    e = ev(device(2.0), {"kind": "profile_host", "ops_ms": 1.0})
    with pytest.raises(NotApplicable, match="launch-bound"):
        R.slow_python_loop(e)
    assert codes(e) == {"launch-bound"}


# --------------------------------------------------------------------------- a busy GPU bounds the cost

def test_syncs_and_pageable_copies_on_a_busy_gpu_are_info_with_their_bound():
    # llm.c's train_gpt2.py on an H200: 3 syncs a step (its own timing), 256 KiB of tokens from
    # pageable memory, GPU busy 95% of a 104 ms step: both were warnings; removing them gains at
    # most the 5% the GPU idles
    busy = device(9.6)  # of a 10 ms step
    sync = ev(busy, {"kind": "profile_syncs", "per_step": [3, 3, 3], "wait_ms": 5.0,
                     "sites": [{"site": "train.py:837", "code": "torch.cuda.synchronize()",
                                "per_step": 1.0, "ops": ["cudaDeviceSynchronize"]}]})
    (f,) = R.host_sync_in_loop(sync)
    assert f.severity == "info" and f.evidence["gpu_busy_share"] == 0.96
    assert f.evidence["costs_at_most"].startswith("4% of the step")
    copies = ev(busy, {"kind": "profile_copies", "pageable_h2d_per_step": [2, 2, 2],
                       "pageable_h2d_bytes_per_step": [256 << 10] * 3, "pageable_h2d_ms": 0.01,
                       "pageable_sites": [{"site": "train.py:802", "bytes_per_step": 256 << 10}]})
    (f,) = R.pageable_h2d_copy(copies)
    assert f.severity == "info" and "costs_at_most" in f.evidence


def test_the_same_on_a_gpu_idle_a_tenth_of_the_step_still_warns():
    (f,) = R.host_sync_in_loop(sync_ev([3, 3, 3]))  # busy 8 ms of 10
    assert f.severity == "warning" and "costs_at_most" not in f.evidence


# --------------------------------------------------------------------------- gemm-unaligned

def shapes_ev(odd_ms, odd_tflops, even_tflops=500.0, busy_ms=9.0):
    from torchdoctor.rules import profile_gemm as G

    return G, ev(device(busy_ms), {"kind": "profile_gemm_shapes", "min_flop": 1e9, "unaligned_ms": odd_ms,
                                   "unaligned_tflops": odd_tflops, "aligned_ms": 3.0, "aligned_tflops": even_tflops,
                                   "unaligned": [{"op": "aten::mm", "shape": "[16384×768]·[768×50257]",
                                                  "dtype": "bfloat16", "site": "train_gpt2.py:199",
                                                  "calls": 1.0, "device_ms": odd_ms, "tflops": odd_tflops}]})


def test_slow_unaligned_matmuls_taking_a_tenth_of_the_gpu_warn_with_the_shape_and_line():
    G, e = shapes_ev(3.0, 95.0)
    (f,) = G.gemm_unaligned(e)
    assert f.severity == "warning"
    assert "95 TFLOP/s, the aligned ones at 500" in f.title
    assert "[16384×768]·[768×50257] at train_gpt2.py:199" in f.title
    assert f.evidence["gain_if_as_fast_ms_per_step"] == pytest.approx(3.0 * (1 - 95 / 500), abs=1e-3)
    assert "50304" in f.fix


def test_unaligned_matmuls_that_are_fast_or_few_stay_silent():
    G, e = shapes_ev(3.0, 400.0)  # 80% of the aligned rate: the alignment costs little
    assert G.gemm_unaligned(e) == []
    G, e = shapes_ev(0.5, 95.0)  # 6% of GPU time
    assert G.gemm_unaligned(e) == []
    G, e = shapes_ev(0.0, None)
    assert G.gemm_unaligned(e) == []
