"""Which reduction should the forward watch use? NaN/Inf propagation and cost, measured.

The ``nan`` probe reduces every watched forward tensor to a few numbers that are non-finite
exactly when the tensor is. This script answers two questions on the machine it runs on:

1. **Propagation**: for ``torch.aminmax`` (per tensor), ``torch._foreach_norm`` (ord inf and 1)
   and ``torch._foreach_max`` (when present), is a single NaN / +Inf / -Inf anywhere in a tensor
   seen in the result, for each dtype, several sizes and positions? (CUDA multi-tensor kernels
   take other paths than the CPU ones; a max that ignores NaN would hide it.)
2. **Cost** on the activations of the ``gpu-transformer`` workload of ``bench/nan_overhead.py``
   (the floating outputs of every module of one bf16-autocast forward): host time to issue, and
   device time (CUDA events), per forward, of one ``aminmax`` per tensor against one fused
   ``_foreach_*`` call per dtype.

    python bench/reduce_kernels.py [--device cuda] [--reps 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _ops(torch):
    ops = {
        "aminmax": lambda ts: [torch.stack(torch.aminmax(t)) for t in ts],
        "norm_inf": lambda ts: torch._foreach_norm(ts, float("inf")),
        "norm_1": lambda ts: torch._foreach_norm(ts, 1),
    }
    if hasattr(torch, "_foreach_max"):
        ops["max"] = lambda ts: torch._foreach_max(ts)
    return ops


def propagation(torch, dev: str) -> list[str]:
    """Rows 'op dtype value: ok/MISSED (n cases)'; a case is a list of 4 tensors, the bad value
    at one position of one tensor."""
    ops = _ops(torch)
    lines = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for bad in (float("nan"), float("inf"), float("-inf")):
            for name, op in ops.items():
                missed, n = [], 0
                for size in (1, 5, 1000, 65537, 3_000_001):
                    for pos in sorted({0, size // 2, size - 1}):
                        for which in (0, 3):
                            ts = [torch.randn(size if i == which else 777, device=dev).to(dtype)
                                  for i in range(4)]
                            ts[which][pos] = bad
                            out = op(ts)
                            vals = [torch.as_tensor(o).float().flatten().tolist() for o in out]
                            got = vals[which]
                            n += 1
                            if math.isnan(bad):
                                ok = any(math.isnan(v) for v in got)
                            elif name == "max" and bad < 0:
                                ok = True  # a max cannot see -Inf (unless all are -Inf): by design
                            else:
                                ok = any(math.isinf(v) for v in got)
                            others_ok = all(math.isfinite(v) for i, vs in enumerate(vals)
                                            if i != which for v in vs)
                            if not ok or not others_ok:
                                missed.append(f"size {size} pos {pos} tensor {which}")
                lines.append(f"{name:<9} {str(dtype).replace('torch.', ''):<9} {bad!s:<5}: "
                             + ("ok" if not missed else f"MISSED {len(missed)}/{n}: {missed[:3]}")
                             + f" ({n} cases)")
    return lines


def activations(torch, dev: str) -> list:
    import nan_overhead

    step, _ = nan_overhead.build_workload("gpu-transformer" if dev == "cuda" else "cpu-mlp",
                                          "reduce_kernels_workload")
    outs: list = []

    def hook(_m, _a, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            outs.append(out.detach())

    h = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        step()
    finally:
        h.remove()
    return outs


def cost(torch, dev: str, reps: int) -> list[str]:
    ts = activations(torch, dev)
    groups: dict = {}
    for t in ts:
        groups.setdefault(t.dtype, []).append(t)
    mb = sum(t.numel() * t.element_size() for t in ts) / 2**20
    lines = [f"{len(ts)} activations, {mb:.1f} MiB, dtypes "
             + ", ".join(f"{str(k).replace('torch.', '')} x{len(v)}" for k, v in groups.items())]
    ops = _ops(torch)
    cuda = dev == "cuda"
    for name, op in ops.items():
        host, devms = [], []
        for _ in range(reps):
            if cuda:
                torch.cuda.synchronize()
                b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                b.record()
            t0 = time.perf_counter()
            with torch.no_grad():
                for g in groups.values():
                    op(g)
            host.append((time.perf_counter() - t0) * 1e3)
            if cuda:
                e.record()
                e.synchronize()
                devms.append(b.elapsed_time(e))
        lines.append(f"{name:<9} host {statistics.median(host):7.3f} ms"
                     + (f"  device {statistics.median(devms):7.3f} ms" if cuda else ""))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    import torch

    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    name = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}")
    print("propagation (one bad value in one of 4 tensors):")
    for line in propagation(torch, a.device):
        print("  " + line)
    print("cost per forward:")
    for line in cost(torch, a.device, a.reps):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
