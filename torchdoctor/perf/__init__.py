"""Performance yardsticks: what a step achieves against what the hardware can do.

- ``peaks``: the dense peak FLOP/s of known GPUs per math dtype (NVIDIA data sheets; sources in
  docs/yardstick.md), looked up by the exact device name torch reports.
- ``flops``: the pure arithmetic of achieved FLOP/s and model FLOPs utilisation (MFU) from a
  counted step and a measured step time.

Nothing here imports torch: the counting itself runs in the child
(``torchdoctor/instruments/perf/flop_count.py``), the metrics in the parent
(``torchdoctor/pipeline/flops_metrics.py``).
"""
