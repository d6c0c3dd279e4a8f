"""Dense peak FLOP/s of known GPUs, per math dtype: the denominator of MFU.

Every number is the vendor's data-sheet figure **without sparsity** (NVIDIA prints the tensor-core
rows "with sparsity" and notes that dense is one half: those rows are halved here), in TFLOP/s.
The source of each line is in docs/yardstick.md ("Peak table"); a test checks that the page lists
every entry with its numbers.

Dtype classes (what the FLOP counter reports, ``instruments/perf/flop_count.py``):

- ``fp32``: float32 math on the CUDA cores (matmuls with TF32 off, the default for matmuls);
- ``tf32``: float32 matmuls/convolutions that run on tensor cores because TF32 is allowed
  (``torch.backends.cuda.matmul.allow_tf32`` for matmuls, ``torch.backends.cudnn.allow_tf32``,
  on by default, for convolutions);
- ``bf16``, ``fp16``: tensor-core math in those dtypes (autocast or a half model);
- ``fp8``: float8 matmuls (``torch._scaled_mm``).

The device name must match one pattern **exactly** (``re.fullmatch`` on the name torch reports):
"NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe" has its own line, "NVIDIA A10G"
(AWS's variant, no NVIDIA data sheet) matches nothing rather than the A10's line. A GPU or a
dtype that is not in the table gives no MFU, with the reason; never a guess.

Pure data and lookups: no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
TERA = 1e12


@dataclass(frozen=True)
class GpuPeak:
    key: str  # short id, used in docs and JSON
    label: str  # the product as the data sheet names it
    pattern: str  # re.fullmatch against torch.cuda.get_device_name()
    tflops: dict[str, float] = field(default_factory=dict)  # dense TFLOP/s per dtype class
    source: str = ""  # the data sheet (full reference in docs/yardstick.md)


def _p(key: str, label: str, pattern: str, source: str, **tflops: float) -> GpuPeak:
    return GpuPeak(key, label, pattern, dict(tflops), source)


# Dense TFLOP/s. Tensor-core rows are half the data sheet's "with sparsity" figure.
PEAKS: tuple[GpuPeak, ...] = (
    _p("h100-sxm", "NVIDIA H100 SXM5 80GB", r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM5 80GB",
       "NVIDIA H100 Tensor Core GPU data sheet (H100 SXM column)",
       fp32=67.0, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979.0),
    _p("h100-pcie", "NVIDIA H100 PCIe 80GB", r"NVIDIA H100 PCIe",
       "NVIDIA H100 Tensor Core GPU data sheet (H100 PCIe column)",
       fp32=51.0, tf32=378.0, bf16=756.5, fp16=756.5, fp8=1513.0),
    _p("h100-nvl", "NVIDIA H100 NVL 94GB", r"NVIDIA H100 NVL",
       "NVIDIA H100 Tensor Core GPU data sheet (H100 NVL column)",
       fp32=60.0, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5),
    _p("h200-sxm", "NVIDIA H200 SXM 141GB", r"NVIDIA H200",
       "NVIDIA H200 Tensor Core GPU data sheet (H200 SXM column)",
       fp32=67.0, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979.0),
    _p("h200-nvl", "NVIDIA H200 NVL 141GB", r"NVIDIA H200 NVL",
       "NVIDIA H200 Tensor Core GPU data sheet (H200 NVL column)",
       fp32=60.0, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5),
    _p("a100", "NVIDIA A100 40GB/80GB (SXM4 and PCIe)",
       r"NVIDIA A100-SXM4-(?:40|80)GB|NVIDIA A100-PCIE-40GB|NVIDIA A100 80GB PCIe",
       "NVIDIA A100 Tensor Core GPU data sheet (same figures for SXM and PCIe)",
       fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    _p("l40s", "NVIDIA L40S", r"NVIDIA L40S", "NVIDIA L40S GPU data sheet",
       fp32=91.6, tf32=183.0, bf16=362.05, fp16=362.05, fp8=733.0),
    _p("l4", "NVIDIA L4", r"NVIDIA L4", "NVIDIA L4 Tensor Core GPU data sheet",
       fp32=30.3, tf32=60.0, bf16=121.0, fp16=121.0, fp8=242.5),
    _p("a10", "NVIDIA A10", r"NVIDIA A10", "NVIDIA A10 Tensor Core GPU data sheet",
       fp32=31.2, tf32=62.5, bf16=125.0, fp16=125.0),
    _p("v100-sxm2", "NVIDIA V100 SXM2", r"Tesla V100-SXM2-(?:16|32)GB", "NVIDIA V100 data sheet (SXM2)",
       fp32=15.7, fp16=125.0),
    _p("v100-pcie", "NVIDIA V100 PCIe", r"Tesla V100-PCIE-(?:16|32)GB", "NVIDIA V100 data sheet (PCIe)",
       fp32=14.0, fp16=112.0),
    _p("t4", "NVIDIA T4", r"Tesla T4", "NVIDIA T4 data sheet", fp32=8.1, fp16=65.0),
)

_RX = {p.key: re.compile(p.pattern) for p in PEAKS}


def lookup(device_name: str | None) -> GpuPeak | None:
    """The table's line for ``device_name`` (exact match of one pattern), or None."""
    if not device_name:
        return None
    name = " ".join(str(device_name).split())
    for p in PEAKS:
        if _RX[p.key].fullmatch(name):
            return p
    return None


def peak_flops(device_name: str | None, dtype: str) -> tuple[float | None, str | None]:
    """(dense peak FLOP/s, None) for ``dtype`` on ``device_name``, or (None, why not)."""
    p = lookup(device_name)
    if p is None:
        return None, f"no published dense peak known for GPU {device_name!r} (docs/yardstick.md)"
    if dtype not in p.tflops:
        return None, f"{p.label}: no {dtype} peak in its data sheet"
    return p.tflops[dtype] * TERA, None


def card_peak(device_name: str | None) -> tuple[float | None, str | None]:
    """(FLOP/s, dtype) of the card's one fixed MFU yardstick: its dense bf16 tensor-core peak,
    fp16 where the data sheet has no bf16 row (V100, T4); (None, None) for an unknown card."""
    p = lookup(device_name)
    if p is None:
        return None, None
    for d in ("bf16", "fp16"):
        if d in p.tflops:
            return p.tflops[d] * TERA, d
    return None, None
