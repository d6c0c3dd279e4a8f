"""The yardstick's judgment-free side: the peak table (exact device names, sources in the docs),
the MFU arithmetic, and metrics.flops from synthetic evidence (the counted step left out of the
step statistics, atypical steps, absent figures with their reason)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.perf.flops import CPU_NO_MFU, mfu
from torchdoctor.perf.peaks import PEAKS, lookup, peak_flops
from torchdoctor.pipeline.flops_metrics import flops_metrics, flops_metrics_with
from torchdoctor.evidence.steps import judged_steps, step_summary

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA A10", "a10"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    # near misses: no line rather than a wrong one
    ("NVIDIA A10G", None),  # AWS's variant: no NVIDIA data sheet
    ("NVIDIA L40", None),
    ("NVIDIA H100", None),  # which one? SXM and PCIe differ by 30%
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),  # a MIG slice has a fraction of the SMs
    ("NVIDIA GeForce RTX 4090", None),
    ("", None),
    (None, None),
])
def test_the_device_name_must_match_exactly(name, key):
    got = lookup(name)
    assert (got.key if got else None) == key


def test_peaks_are_dense_and_ordered():
    for p in PEAKS:
        t = p.tflops
        assert t["fp32"] > 0
        for low, high in (("fp32", "tf32"), ("tf32", "bf16"), ("bf16", "fp8")):
            if low in t and high in t:
                assert t[high] > t[low], (p.key, low, high)
    h = lookup("NVIDIA H100 80GB HBM3").tflops
    assert h["bf16"] == 989.5 and h["tf32"] == 494.5  # half the sheet's "with sparsity" 1979 / 989


def test_every_peak_and_its_source_is_in_the_docs():
    page = (DOCS / "yardstick.md").read_text()
    for p in PEAKS:
        row = next((ln for ln in page.splitlines() if ln.startswith(f"| `{p.key}`")), None)
        assert row, f"docs/yardstick.md has no row for {p.key}"
        for d, v in p.tflops.items():
            assert re.search(rf"\b{d}\b[^|]*\b{re.escape(f'{v:g}')}\b", row) or f"{v:g}" in row, (p.key, d, v)
        assert "data sheet" in row.lower(), p.key


def test_mfu_single_dtype_mixed_dtypes_and_the_reasons_it_is_absent():
    m = mfu({"bf16": 989.5e12 * 0.01}, 0.02, "cuda", "NVIDIA H100 80GB HBM3")
    assert m["mfu"] == pytest.approx(0.5) and m["dtype"] == "bf16"
    # 1 PFLOP of bf16 (1.0106 s at peak) and 0.067 PFLOP of fp32 (1 s at peak) in 4.0212 s: 50%
    m = mfu({"bf16": 1e15, "fp32": 67e12}, 2 * (1e15 / 989.5e12 + 1.0), "cuda", "NVIDIA H100 80GB HBM3")
    assert m["mfu_dtype_peak"] == pytest.approx(0.5) and m["dtype"] == "bf16"
    # MFU itself is against the card's one bf16 peak, whatever the mix
    assert m["mfu"] == pytest.approx(1.067e15 / (2 * (1e15 / 989.5e12 + 1.0)) / 989.5e12)
    assert m["peak_flops_per_s"] == pytest.approx(989.5e12) and m["peak_dtype"] == "bf16"
    m = mfu({"fp32": 1e9}, 0.01, "cpu", None)
    assert "mfu" not in m and m["mfu_reason"] == CPU_NO_MFU and m["achieved_flops_per_s"] == pytest.approx(1e11)
    assert "A10G" in mfu({"bf16": 1e12}, 1.0, "cuda", "NVIDIA A10G")["mfu_reason"]
    assert "no bf16 peak" in mfu({"bf16": 1e12}, 1.0, "cuda", "Tesla T4")["mfu_reason"]
    assert peak_flops("NVIDIA H100 PCIe", "fp8") == (1513e12, None)


def _steps(n, wall=0.01, slow=None, batches=1):
    out = []
    for s in range(1, n + 1):
        w = 0.5 if s == 1 else (wall * 7 if s == slow else wall)
        out.append({"kind": "step", "step": s, "wall_s": w, "batches": batches, "backwards": 1,
                    "data_s": 0.0, "forward_s": w / 3, "backward_s": w / 3, "optimizer_s": w / 3,
                    "other_s": 0.0})
    return out


def _flops(step=2, **kw):
    ev = {"kind": "flops", "status": "ok", "counted_step": step, "entered": True, "flops": 8_000_000,
          "flops_by_dtype": {"fp32": 8_000_000}, "by_op": {"mm": 8_000_000}, "device": "cpu",
          "device_name": None, "errors": []}
    ev.update(kw)
    return ev


def test_the_counted_step_is_left_out_of_the_step_statistics():
    """Step 2 ran under the counter (7x slower): not in the judged steps, nor the mean."""
    ev = Evidence.from_events(_steps(10, slow=2) + [_flops()])
    assert [s["step"] for s in judged_steps(ev)] == [3, 4, 5, 6, 7, 8, 9, 10]
    summ = step_summary(ev)
    assert summ["mean_step_ms"] == pytest.approx(10.0) and summ["flop_count_step_skipped"] == [2]
    m = flops_metrics(ev)
    assert m["status"] == "ok" and m["step_ms"] == pytest.approx(10.0) and m["steps_timed"] == 8
    assert m["achieved_flops_per_s"] == pytest.approx(8e8) and m["counter_cost"] == pytest.approx(7.0)
    assert m["flops_per_step"] == 8_000_000 and m["dtype"] == "fp32" and "mfu" not in m


def test_the_profilers_steps_are_not_timed_either():
    w = {"kind": "profile_window", "status": "ok", "first_step": 7, "warmup": 1, "active": 3,
         "budget": {"py_calls_per_step": 100}, "steps": [7, 8, 9]}
    events = _steps(14, slow=2)
    for e in events:
        if 5 <= e["step"] <= 10:
            e["wall_s"] = 0.05
    m = flops_metrics(Evidence.from_events(events + [w, _flops()]))
    assert m["steps_timed"] == 6 and m["step_ms"] == pytest.approx(10.0)  # 3, 4, 11..14


def test_a_gpu_step_gets_its_mfu():
    ev = Evidence.from_events(_steps(6) + [_flops(flops=int(4.947e12), flops_by_dtype={"tf32": int(4.947e12)},
                                                  device="cuda", device_name="NVIDIA H100 80GB HBM3")])
    m = flops_metrics(ev)
    assert m["mfu_dtype_peak"] == pytest.approx(1.0, rel=1e-3) and m["dtype"] == "tf32"
    assert m["dtype_peak_flops_per_s"] == pytest.approx(494.5e12) and "h100-sxm" in m["peak_source"]
    # the MFU is against the card's bf16 peak: TF32 at its own peak is half of it
    assert m["mfu"] == pytest.approx(0.5, rel=1e-3) and m["peak_flops_per_s"] == pytest.approx(989.5e12)
    assert "mfu_suspect" not in m


def test_mfu_before_and_after_a_precision_change_share_one_peak():
    # regression (H200, GPU-truth issue): the TF32 trial read "mfu 0.727 -> 0.493" after a 5.3x
    # speed-up, because each side was divided by its own dtype's peak
    card = "NVIDIA H200"
    fp32 = mfu({"fp32": 1e12}, 1e12 / (67e12 * 0.727), "cuda", card)
    tf32 = mfu({"tf32": 1e12}, 1e12 / (67e12 * 0.727) / 5.3, "cuda", card)
    assert tf32["mfu"] == pytest.approx(5.3 * fp32["mfu"])
    assert fp32["peak_flops_per_s"] == tf32["peak_flops_per_s"] == pytest.approx(989.5e12)
    assert fp32["mfu_dtype_peak"] == pytest.approx(0.727)


def test_an_mfu_above_75_percent_is_flagged_suspect():
    m = mfu({"bf16": 989.5e12 * 0.8}, 1.0, "cuda", "NVIDIA H100 80GB HBM3")
    assert m["mfu"] == pytest.approx(0.8) and "above 75%" in m["mfu_suspect"]
    assert "mfu_suspect" not in mfu({"bf16": 989.5e12 * 0.7}, 1.0, "cuda", "NVIDIA H100 80GB HBM3")
    # a card with no tensor-core row keeps its dtype's peak as the yardstick (T4: fp16 row exists)
    assert mfu({"fp32": 8.1e12 * 0.5}, 1.0, "cuda", "Tesla T4")["peak_dtype"] == "fp16"


def test_a_gpu_step_is_timed_by_the_device_when_the_host_runs_ahead():
    # regression (H200, bf16 fixture): the host returned from each step in 1.8 ms while the GPU
    # took ~18 ms: timed by the host, the MFU came out 6.8
    events = _steps(8)  # host: 10 ms a step
    events += [{"kind": "step_device", "step": s, "device": 0, "span_ms": 40.0 if s != 2 else 300.0}
               for s in range(1, 9)]
    ev = Evidence.from_events(events + [_flops(flops=int(19.78e12), flops_by_dtype={"bf16": int(19.78e12)},
                                               device="cuda", device_name="NVIDIA H100 80GB HBM3")])
    m = flops_metrics(ev)
    assert m["step_ms"] == pytest.approx(40.0) and m["step_time_basis"].startswith("device")
    assert m["mfu"] == pytest.approx(19.78e12 / 0.04 / 989.5e12, rel=1e-3)
    # the host's time where no device span was read
    m2 = flops_metrics(Evidence.from_events(_steps(8) + [_flops(device="cuda",
                                                                device_name="NVIDIA H100 80GB HBM3")]))
    assert m2["step_ms"] == pytest.approx(10.0) and m2["step_time_basis"] == "host wall"


def test_no_figure_is_guessed():
    ev = Evidence.from_events(_steps(6) + [{"kind": "flops", "status": "skipped", "counted_step": 2,
                                            "entered": False, "reason": "torch.compile is in use: ..."}])
    m = flops_metrics(ev)
    assert m == {"status": "skipped", "counted_step": 2, "reason": "torch.compile is in use: ..."}
    assert [s["step"] for s in judged_steps(ev)][0] == 2  # never entered: step 2 is a plain step
    # a counted step that took two batches (an evaluation pass in it?) is not one step's FLOPs
    ev = _steps(6)
    ev[1]["batches"] = 2
    m = flops_metrics(Evidence.from_events(ev + [_flops()]))
    assert m["status"] == "atypical" and "2 batches" in m["reason"] and "flops_per_step" not in m
    assert flops_metrics(Evidence.from_events(_steps(6))) is None  # not armed: no section at all


def test_a_treated_run_can_borrow_the_baselines_count():
    """treat's compile trial: the counter cannot run there; the same model's FLOPs, the treated
    run's own step time, and the source says so."""
    treated = Evidence.from_events(_steps(6, wall=0.005))
    m = flops_metrics_with(treated, _flops(), source="baseline run's count (step 2)")
    assert m["achieved_flops_per_s"] == pytest.approx(1.6e9) and m["source"].startswith("baseline")
    assert "counter_cost" not in m


def test_the_console_line():
    from rich.console import Console

    from torchdoctor.report.sections.flops import flops_line

    con = Console(width=200, record=True)
    ev = Evidence.from_events(_steps(6) + [_flops(flops=int(9.895e12), flops_by_dtype={"bf16": int(9.895e12)},
                                                  device="cuda", device_name="NVIDIA H100 80GB HBM3")])
    con.print(flops_line(flops_metrics(ev)))
    out = con.export_text()
    assert "9.89 TFLOP per step (step 2, bf16) in a 10 ms median step = 990 TFLOP/s; MFU 100.0% (suspect) of 990 TFLOP/s bf16 peak (NVIDIA H100 80GB HBM3)" in out
    con.print(flops_line({"status": "skipped", "reason": "torch.compile is in use"}))
    assert "not measured (skipped): torch.compile is in use" in con.export_text()
