"""Bench workload: a heavy step with many small Python allocations (a stand-in for the
accelerate/BERT example of issue 13, where the memory sampler's site window cost 1.87x).

Each step "tokenizes" (builds ``--objs`` small Python objects, dropped at the step's end), runs a
small transformer encoder forward/backward on one thread, and keeps ``--leak-kib`` KiB of
per-step buffers (bytes objects: malloc'd, so the host heap counter sees them rise and the
sampler arms its site window; ``--leak-kib 0``: nothing kept). Writes whole-loop and per-step
times to ``--result`` when given.
"""
import argparse
import json
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--objs", type=int, default=20000)
p.add_argument("--leak-kib", type=int, default=64)
p.add_argument("--result", default=None)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False))
head = nn.Linear(128, 2)
opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
kept = []
t0 = time.perf_counter()
walls = []
for step in range(a.steps):
    ts = time.perf_counter()
    batch = [{"id": i, "tok": f"tok{i % 997}", "mask": (i % 3, i % 5)} for i in range(a.objs)]
    ids = torch.tensor([b["id"] % 128 for b in batch[:16 * 32]]).view(16, 32)
    x = nn.functional.one_hot(ids, 128).float()
    loss = nn.functional.cross_entropy(head(model(x).mean(1)), torch.randint(0, 2, (16,)))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    kept.extend(bytes(1024) + bytes([step % 256]) for _ in range(a.leak_kib))  # the slow leak
    del batch
    walls.append(time.perf_counter() - ts)
total = time.perf_counter() - t0
if a.result:
    with open(a.result, "w") as f:
        json.dump({"loop_s": total, "step_ms": sorted(walls)[len(walls) // 2] * 1e3,
                   "steps": a.steps}, f)
print(f"{a.steps} steps in {total:.2f} s")
