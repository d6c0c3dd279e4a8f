"""The profiler-window analysis on synthetic flats and on real H100 flats (no torch, no GPU).

The H100 flats under tests/fixtures/scripts/profile/flats/ were recorded by `torchdoctor profile`
on an H100 (torch 2.11.0+cu130) from the gpu_*.py fixture scripts beside them, then shrunk
(Kineto nodes placed in the tree and library leaf C calls dropped); the *.events.json files hold
the step-clock events of the same runs. h100_gpu_healthy is of gpu_healthy.py's first version
(256 input features: on an H200 host a true dataloader-bound since, see that script).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.instruments.profile._profile_analysis import Sources, Window, analyze, syncs
from torchdoctor.judge import judge

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "fixtures" / "scripts" / "profile"
FLATS = SCRIPTS / "flats"

SRC = Sources(is_user=lambda f: f.startswith("train"), show=lambda f: f,
              code=lambda f, n: f"line {n}", is_tool=lambda f: f.startswith("torchdoctor/"))
US = 1000  # ns


class Flat:
    """Build a flat by hand: nodes in depth-first order, times in µs."""

    def __init__(self):
        self.nodes, self.device, self.runtime = [], [], []
        self._corr = 100

    def node(self, parent, tag, name, start, end, tid=1, **extra):
        idx = len(self.nodes)
        self.nodes.append([idx, -1 if parent is None else parent, tag, name, tid, start * US, end * US, extra])
        return idx

    def op(self, parent, name, start, end, user=False, inputs=None, tf32=None):
        self._corr += 1
        extra = {"corr": self._corr, "user": user, "in": inputs or []}
        if tf32 is not None:
            extra["tf32"] = tf32
        return self.node(parent, "op", name, start, end, **extra), self._corr

    def py(self, parent, callee, start, end, file, line, tag="py"):
        return self.node(parent, tag, callee, start, end, file=file, line=line, func="f")

    def step(self, n, start, end):
        return self.op(None, f"ProfilerStep#{n}", start, end, user=True)[0]

    def kernel(self, name, start, end, link, kind="kernel", nbytes=None):
        self.device.append([name, kind, start * US, end * US, 0, link, 7, nbytes])

    def rt(self, name, start, end, link):
        self.runtime.append([name, start * US, end * US, 0, link, 1])

    def flat(self):
        return {"version": 1, "nodes": self.nodes, "device": self.device, "runtime": self.runtime}


def _three_steps(f: Flat) -> list[int]:
    return [f.step(n, 1000 * n, 1000 * n + 1000) for n in (6, 7, 8)]


def test_window_numbers_steps_as_the_step_clock_does():
    f = Flat()
    _three_steps(f)
    w = Window(f.flat())
    assert [s[0] for s in w.steps] == [6, 7, 8]
    out = analyze(f.flat(), SRC)
    assert out["profile_window"]["steps"] == [7, 8, 9]  # ProfilerStep#N covers step N + 1
    assert out["profile_window"]["active_steps"] == 3


def test_the_scripts_own_profiler_steps_are_not_ours():
    f = Flat()
    mod = f.py(None, "train.py(1): <module>", 0, 20000, "train.py", 1)
    for n in (6, 7):
        f.op(mod, f"ProfilerStep#{n}", 1000 * n + 10, 1000 * n + 500, user=True)  # the script's, shorter
        hook = f.py(mod, "torch/profiler/profiler.py(1150): step", 1000 * n, 1000 * n + 5,
                    "torchdoctor/instruments/profile/profiler_window.py", 180)
        f.op(hook, f"ProfilerStep#{n}", 1000 * n, 1000 * n + 1000, user=True)
    w = Window(f.flat())
    assert [(n, e - s) for n, s, e in w.steps] == [(6, 1000 * US), (7, 1000 * US)]


def test_d2h_sync_is_counted_per_step_with_the_user_line():
    f = Flat()
    for s in _three_steps(f):
        start = f.nodes[s][5] // US
        py = f.py(s, "train.py(1): <module>", start + 10, start + 900, "train.py", 1)
        item = f.py(py, "<built-in method item>", start + 100, start + 200, "train.py", 21, tag="pyc")
        op, corr = f.op(item, "aten::_local_scalar_dense", start + 110, start + 190)
        f.rt("cudaMemcpyAsync", start + 120, start + 130, corr)
        f.kernel("Memcpy DtoH (Device -> Pinned)", start + 125, start + 126, corr, kind="memcpy")
        f.rt("cudaStreamSynchronize", start + 131, start + 180, corr)
    out = syncs(Window(f.flat()), SRC)
    assert out["per_step"] == [1, 1, 1]
    assert out["sites"][0]["site"] == "train.py:21"
    assert out["sites"][0]["ops"] == ["aten::_local_scalar_dense"]
    assert out["sites"][0]["code"] == "line 21"
    assert out["wait_ms"] == pytest.approx(0.049)


def test_blocking_h2d_copy_scaler_and_own_syncs_are_not_counted():
    f = Flat()
    s = _three_steps(f)[0]
    py = f.py(s, "train.py(1): <module>", 6010, 6900, "train.py", 1)
    # x.to(dev): pageable H2D copy + the stream sync of a blocking copy
    op, corr = f.op(py, "aten::copy_", 6100, 6200)
    f.kernel("Memcpy HtoD (Pageable -> Device)", 6110, 6150, corr, kind="memcpy")
    f.rt("cudaStreamSynchronize", 6150, 6190, corr)
    # GradScaler's inf check: .item() inside torch/amp/grad_scaler.py
    gs = f.py(py, "torch/amp/grad_scaler.py(300): step", 6300, 6400, "train.py", 30)
    gi = f.py(gs, "<built-in method item>", 6310, 6390, "torch/amp/grad_scaler.py", 350, tag="pyc")
    op2, corr2 = f.op(gi, "aten::_local_scalar_dense", 6311, 6389)
    f.rt("cudaStreamSynchronize", 6320, 6380, corr2)
    # torchdoctor's own sync (no torch op): attributed by time to its Python frame
    td = f.py(py, "torchdoctor/x.py(1): flush", 6500, 6600, "torchdoctor/x.py", 9)
    f.rt("cudaDeviceSynchronize", 6510, 6590, 0)
    # a sync outside any recorded step is ignored
    f.rt("cudaDeviceSynchronize", 100, 200, 0)
    assert td and op and op2
    out = syncs(Window(f.flat()), SRC)
    assert out["per_step"] == [0, 0, 0]
    assert out["excluded"] == {"h2d_copy": 1, "grad_scaler": 1, "tool": 1}


def test_explicit_synchronize_without_op_is_attributed_by_time():
    f = Flat()
    for s in _three_steps(f):
        start = f.nodes[s][5] // US
        py = f.py(s, "train.py(1): <module>", start + 10, start + 900, "train.py", 1)
        cs = f.py(py, "torch/cuda/__init__.py(1080): synchronize", start + 100, start + 300, "train.py", 44)
        f.py(cs, "<built-in function _cuda_synchronize>", start + 110, start + 290, "torch/cuda/__init__.py", 1085,
             tag="pyc")
        f.rt("cudaDeviceSynchronize", start + 120, start + 280, 0)
    out = syncs(Window(f.flat()), SRC)
    assert out["per_step"] == [1, 1, 1]
    assert out["sites"][0]["site"] == "train.py:44"
    assert out["sites"][0]["via"] == "torch/cuda/__init__.py:1085"


def test_pageable_copies_bytes_from_op_shapes_and_site():
    f = Flat()
    for s in _three_steps(f):
        start = f.nodes[s][5] // US
        py = f.py(s, "train.py(1): <module>", start + 10, start + 900, "train.py", 1)
        op, corr = f.op(py, "aten::copy_", start + 100, start + 400,
                        inputs=[["float32", 1 << 20], ["float32", 1 << 20], None])
        f.kernel("Memcpy HtoD (Pageable -> Device)", start + 110, start + 390, corr, kind="memcpy")
        op2, corr2 = f.op(py, "aten::copy_", start + 500, start + 520)
        f.kernel("Memcpy HtoD (Pinned -> Device)", start + 505, start + 510, corr2, kind="memcpy", nbytes=4096)
    out = analyze(f.flat(), SRC)["profile_copies"]
    assert out["pageable_h2d_per_step"] == [1, 1, 1]
    assert out["pageable_h2d_bytes_per_step"] == [4 << 20] * 3
    assert out["pageable_sites"][0]["site"] == "train.py:1"
    kinds = {k["kind"]: k for k in out["kinds"]}
    assert kinds["Memcpy HtoD (Pinned -> Device)"]["bytes_per_step"] == 4096


def test_gemm_share_counts_only_plain_float32():
    f = Flat()
    s = _three_steps(f)
    _, c1 = f.op(s[0], "aten::mm", 6100, 6200, inputs=[["float32", 10], ["float32", 10]], tf32=False)
    f.kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn", 6100, 6700, c1)
    _, c2 = f.op(s[0], "aten::mm", 6300, 6400, inputs=[["float32", 10]], tf32=True)
    f.kernel("sm80_xmma_gemm_tf32f32", 6700, 6800, c2)
    _, c3 = f.op(s[1], "aten::addmm", 7100, 7200, inputs=[["bfloat16", 10]])
    f.kernel("nvjet_sm90_tst_128x64", 7100, 7300, c3)
    _, c4 = f.op(s[1], "aten::cudnn_convolution", 7400, 7500, inputs=[["float32", 10]])
    f.kernel("conv_kernel", 7400, 7600, c4)
    _, c5 = f.op(s[2], "aten::add_", 8100, 8200)
    f.kernel("elementwise", 8100, 8400, c5)
    out = analyze(f.flat(), SRC, {"cudnn_allow_tf32": False})["profile_gemm"]
    assert out["kernel_ms"] == pytest.approx(1.4 / 3, abs=1e-4)
    assert out["fp32_plain_ms"] == pytest.approx(0.8 / 3, abs=1e-4)  # fp32 mm + the conv (cudnn TF32 off)
    assert out["mm_conv_by_dtype_ms"]["bfloat16"] == pytest.approx(0.2 / 3, abs=1e-4)
    out = analyze(f.flat(), SRC, {"cudnn_allow_tf32": True})["profile_gemm"]
    assert out["fp32_plain_ms"] == pytest.approx(0.6 / 3, abs=1e-4)


def test_device_mirrors_of_annotations_are_not_gpu_work():
    f = Flat()
    s = _three_steps(f)
    f.op(s[0], "Optimizer.step#SGD.step", 6100, 6200, user=True)
    _, c = f.op(s[0], "aten::add_", 6300, 6310)
    f.kernel("elementwise", 6300, 6310, c)
    f.kernel("ProfilerStep#6", 6000, 9000, 0)  # torch 2.11: annotations show up as device events
    f.kernel("Optimizer.step#SGD.step", 6100, 6200, 0)
    dev = analyze(f.flat(), SRC)["profile_device"]
    assert dev["device_events"] == 1
    assert dev["gpu_busy_ms"] == pytest.approx(0.01 / 3, abs=1e-4)


def test_host_split_and_python_hotspots():
    f = Flat()
    for s in _three_steps(f):
        start = f.nodes[s][5] // US
        mod = f.py(s, "train.py(1): <module>", start, start + 1000, "train.py", 1)
        feat = f.py(mod, "train.py(12): make_features", start + 10, start + 710, "train.py", 30)
        f.py(feat, "<built-in function sin>", start + 20, start + 120, "train.py", 14, tag="pyc")
        dl = f.op(mod, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start + 720, start + 800,
                  user=True)[0]
        f.py(dl, "train.py(40): __getitem__", start + 730, start + 790, "train.py", 5)
        f.op(mod, "aten::addmm", start + 800, start + 900)
    out = analyze(f.flat(), SRC)
    assert out["profile_host"]["ops_ms"] == pytest.approx(0.1)
    assert out["profile_host"]["python_ms"] == pytest.approx(0.9)
    hot = {h["def"]: h for h in out["profile_python"]["functions"]}
    assert hot["train.py:12"]["self_ms"] == pytest.approx(0.6)  # 700 µs minus the 100 µs builtin call
    assert hot["train.py:40"]["in_data"] is True


# --------------------------------------------------------------------------- real H100 flats

def _h100(name: str):
    from torchdoctor.instruments.profile.profiler_window import make_sources

    flat = json.load(gzip.open(FLATS / f"h100_{name}.flat.json.gz", "rt"))
    events = json.loads((FLATS / f"h100_{name}.events.json").read_text())
    window = next(e for e in events if e["kind"] == "profile_window")
    payloads = analyze(flat, make_sources((str(SCRIPTS),)), window.get("flags"))
    w = payloads.pop("profile_window")
    merged = [e for e in events if e["kind"] != "profile_window"]
    merged.append({**window, **w})
    merged += [{"kind": k, **v} for k, v in payloads.items()]
    return Evidence.from_events(merged), payloads


H100_EXPECTED = {
    "gpu_sync": {"host-sync-in-loop", "launch-bound"},
    "gpu_healthy": set(),
    "gpu_pageable": {"pageable-h2d-copy"},
    "gpu_fp32": {"fp32-compute-bound"},
}


@pytest.mark.parametrize("name", sorted(H100_EXPECTED))
def test_h100_flats_raise_exactly_the_planted_codes(name):
    ev, _ = _h100(name)
    report = Report("profile")
    judge("profile", ev, report)
    assert {f.code for f in report.findings} == H100_EXPECTED[name]
    assert not any(s.rule in H100_EXPECTED[name] for s in report.skipped)


def test_h100_sync_and_copy_sites_name_the_planted_lines():
    _, sync = _h100("gpu_sync")
    site = sync["profile_syncs"]["sites"][0]
    assert site["site"].endswith("gpu_sync.py:21") and "loss.item()" in site["code"]
    assert sync["profile_syncs"]["per_step"] == [1, 1, 1]
    _, page = _h100("gpu_pageable")
    site = page["profile_copies"]["pageable_sites"][0]
    assert site["site"].endswith("gpu_pageable.py:17") and ".to(dev)" in site["code"]
    assert site["bytes_per_step"] == 16 << 20
    _, fp32 = _h100("gpu_fp32")
    g = fp32["profile_gemm"]
    assert g["fp32_plain_ms"] / fp32["profile_device"]["gpu_busy_ms"] > 0.5
    assert any(k["name"].startswith("sm80_xmma_gemm_f32f32") for k in g["fp32_kernels"])


# --------------------------------------------------------------------------- partial windows

def _with_teardown(open_range: bool, steps: bool = True):
    """The H100 healthy window (3 clean steps) as a run that ended inside the window: a 4th
    ProfilerStep range opened at step 9's end and closed by the profiler's stop at teardown, in
    which the script's `dist.destroy_process_group()` (line 59) waits for the GPU 8 times and
    launches 14 tiny kernels on an otherwise idle GPU (the 4xH200 fsdp_tp_2d.py run). Without
    ``steps`` the three step ranges are not the window's: the run ended right after the window
    began (fsdp_tp_2d.py: 6 steps, recording from step 6's end), the open range is all there is."""
    from torchdoctor.instruments.profile.profiler_window import make_sources

    flat = json.load(gzip.open(FLATS / "h100_gpu_healthy.flat.json.gz", "rt"))
    events = json.loads((FLATS / "h100_gpu_healthy.events.json").read_text())
    nodes = flat["nodes"]
    t0 = max(n[6] for n in nodes if n[3].startswith("ProfilerStep#")) + 20_000
    end = t0 + 2_000_000  # 2 ms of teardown
    hook = next(n for n in nodes if n[3] == "ProfilerStep#8")[1]  # opened by our window's step
    if not steps:
        for n in nodes:
            if n[3].startswith("ProfilerStep#"):
                n[3] = "before the window"
    nodes.append([len(nodes), hook, "op", "ProfilerStep#9", 1, t0, end,
                  {"corr": 90_000, "in": [], "user": True}])
    call = len(nodes)
    nodes.append([call, 3, "py", "torch/distributed/distributed_c10d.py(2100): destroy_process_group",
                  1, t0 + 1000, end - 1000, {"file": "gpu_healthy.py", "line": 59, "func": "<module>"}])
    for i in range(14):
        s = t0 + 10_000 + i * 100_000
        corr = 90_100 + i
        nodes.append([len(nodes), call, "op", "aten::fill_", 1, s, s + 20_000,
                      {"corr": corr, "in": [], "user": False}])
        flat["device"].append(["void at::native::vectorized_elementwise_kernel<fill>", "kernel",
                               s + 5000, s + 9320, 7, corr, 7, None])
        if i < 8:
            flat["runtime"].append(["cudaStreamSynchronize", s + 30_000, s + 90_000, 1, 0, 1])
    flat["last_step_open"] = open_range
    window = next(e for e in events if e["kind"] == "profile_window")
    window = {**window, "status": "partial" if open_range else "ok"}
    payloads = analyze(flat, make_sources((str(SCRIPTS),)), window.get("flags"))
    merged = [e for e in events if e["kind"] != "profile_window"]
    merged.append({**window, **payloads.pop("profile_window")})
    merged += [{"kind": k, **v} for k, v in payloads.items()]
    report = Report("profile")
    judge("profile", Evidence.from_events(merged), report)
    return {f.code for f in report.findings}, merged


def test_teardown_after_the_last_step_of_a_partial_window_is_not_a_step():
    """4xH200 fsdp_tp_2d.py under `profile`: the run ended inside the window, whose last range
    took in the DCP save and destroy_process_group; that teardown was judged as a step
    (host-sync-in-loop "4x per step at fsdp_tp_2d.py:59 (dist.destroy_process_group())",
    launch-bound "busy only 45% of the step"). The open range is not a step: same verdict and
    numbers as the three complete steps alone."""
    got, merged = _with_teardown(open_range=True)
    assert got == set(), got
    kinds = {e["kind"]: e for e in merged}
    w = kinds["profile_window"]
    assert (w["active_steps"], w["steps"], w["open_step_dropped"]) == (3, [7, 8, 9], True)
    assert kinds["profile_syncs"]["per_step"] == [0, 0, 0]
    assert not any(o["name"] == "aten::fill_" for o in kinds["profile_ops"]["by_self_cpu"])
    assert "destroy_process_group" not in json.dumps(kinds["profile_python"])
    _, clean = _h100("gpu_healthy")
    same = ("gpu_busy_ms", "kernels_per_step", "kernel_ms", "median_kernel_us")
    assert {k: kinds["profile_device"][k] for k in same} == {k: clean["profile_device"][k] for k in same}


def test_a_window_holding_only_the_teardown_is_not_judged():
    """The 4xH200 case itself: recording began at the last step's end, so the window's one range
    was the teardown. Judged as a step it raised the reported false alarms (the test can fail);
    as the open range it leaves no complete step, and no window rule judges."""
    before, _ = _with_teardown(open_range=False, steps=False)
    assert {"host-sync-in-loop", "launch-bound"} <= before, before
    got, merged = _with_teardown(open_range=True, steps=False)
    assert got == set(), got
    [w] = [e for e in merged if e["kind"] == "profile_window"]
    assert w["active_steps"] == 0 and w["status"] == "partial"
    report = Report("profile")
    judge("profile", Evidence.from_events(merged), report)
    why = {s.rule: s.reason for s in report.skipped}
    assert "the run ended inside it" in why["host-sync-in-loop"], why


def test_a_partial_window_without_a_complete_step_is_not_judged():
    f = Flat()
    f.step(6, 6000, 7000)  # the only range: opened at step 6's end, closed by the stop
    flat = {**f.flat(), "last_step_open": True}
    out = analyze(flat, SRC)
    assert out["profile_window"]["active_steps"] == 0 and set(out) == {"profile_window"}
    from torchdoctor.judge import NotApplicable
    from torchdoctor.rules.profile import window

    with pytest.raises(NotApplicable, match="no complete step"):
        window(Evidence.from_events([{"kind": "profile_window", "status": "partial",
                                      **out["profile_window"]}]))


def test_matmuls_are_split_by_alignment_with_their_flop_rate():
    # llm.c's GPT-2 on an H200: the output layer's [16384x768]·[768x50257] ran on align1 kernels
    # at ~95 TFLOP/s while the blocks' aligned matmuls ran several times faster
    f = Flat()
    s = _three_steps(f)
    bf = [["bfloat16", 1], ["bfloat16", 1]]
    _, c1 = f.op(s[0], "aten::mm", 6100, 6200, inputs=bf)
    f.nodes[-1][7]["shapes"] = [[16384, 768], [768, 50257]]
    f.kernel("cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1", 6100, 6500, c1)  # 400 µs
    _, c2 = f.op(s[0], "aten::addmm", 6600, 6700, inputs=[["bfloat16", 1]] * 3)
    f.nodes[-1][7]["shapes"] = [[2304], [16384, 768], [768, 2304]]
    f.kernel("nvjet_sm90_tst_256x128", 6600, 6650, c2)  # 50 µs
    _, c3 = f.op(s[0], "aten::mm", 6800, 6810, inputs=bf)  # small: not judged
    f.nodes[-1][7]["shapes"] = [[7, 9], [9, 11]]
    f.kernel("gemv", 6800, 6801, c3)
    out = analyze(f.flat(), SRC)["profile_gemm_shapes"]
    flop_odd, flop_even = 2 * 16384 * 768 * 50257, 2 * 16384 * 768 * 2304
    assert out["unaligned_tflops"] == pytest.approx(flop_odd / 400e-6 / 1e12, abs=0.1)
    assert out["aligned_tflops"] == pytest.approx(flop_even / 50e-6 / 1e12, abs=0.1)
    assert out["unaligned_ms"] == pytest.approx(0.4 / 3, abs=1e-4)
    [row] = out["unaligned"]
    assert row["shape"] == "[16384×768]·[768×50257]" and row["dtype"] == "bfloat16"


def test_batched_and_biased_matmuls_are_read_as_batch_m_k_n():
    from torchdoctor.instruments.profile._profile_gemm import dims

    assert dims("aten::bmm", [[12, 1024, 64], [12, 64, 1024]]) == (12, 1024, 64, 1024)
    assert dims("aten::baddbmm", [[12, 1, 1], [12, 1024, 64], [12, 64, 1024]]) == (12, 1024, 64, 1024)
    assert dims("aten::addmm", [[10], [32, 7], [7, 10]]) == (1, 32, 7, 10)
    assert dims("aten::mm", [[32, 7], [8, 10]]) is None  # inner dims disagree: not read
    assert dims("aten::mm", [None, [8, 10]]) is None
