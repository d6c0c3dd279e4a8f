"""The cure for gemm-unaligned, measured: the same matmuls with an odd dimension and padded.

GPT-2's output layer (batch x sequence 16384, width 768) in bfloat16 with a vocabulary of 50257
(llm.c's train_gpt2.py) and of 50304 (padded to a multiple of 64): forward ``x @ W.T``, the input
gradient ``g @ W`` and the weight gradient ``g.T @ x``, each timed with CUDA events (20 runs after
5 warm-up, median), printed as ms and TFLOP/s, and the speed-up of the padded shape.

    python3 bench/gemm_align.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch


def timed(fn, runs=20, warm=5) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    rows, m, k = [], 16384, 768
    for vocab in (50257, 50304):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(vocab, k, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(m, vocab, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * m * k * vocab
        for name, fn in (("forward x@W.T", lambda: x @ w.t()), ("input grad g@W", lambda: g @ w),
                         ("weight grad g.T@x", lambda: g.t() @ x)):
            ms = timed(fn)
            rows.append({"vocab": vocab, "matmul": name, "ms": round(ms, 4), "tflops": round(flop / ms / 1e9, 1)})
    for r in rows:
        twin = next(t for t in rows if t["vocab"] == 50304 and t["matmul"] == r["matmul"])
        r["padded_speedup"] = round(r["ms"] / twin["ms"], 3)
        print(f"{torch.cuda.get_device_name()}  vocab {r['vocab']}  {r['matmul']:18s} {r['ms']:8.3f} ms "
              f"{r['tflops']:7.1f} TFLOP/s  time / padded time {r['padded_speedup']}")
    if a.json:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
