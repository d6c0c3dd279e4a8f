"""Bench workload (a): a small CPU MLP, one thread, in-memory DataLoader.

Times its own steady-state steps (after --warmup steps) with perf_counter and writes
{"step_ms": ..., "steps": ...} to --result. The same code runs bare and under torchdoctor, so
the difference in step_ms is the instruments' cost inside the step.
"""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=150)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--result", required=True)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
n = (a.steps + a.warmup) * 64
loader = DataLoader(TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,))), batch_size=64)
t0 = None
for i, (x, y) in enumerate(loader):
    if i == a.warmup:
        t0, c0 = time.perf_counter(), time.thread_time()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
dt, dc = time.perf_counter() - t0, time.thread_time() - c0
with open(a.result, "w") as f:
    json.dump({"step_ms": dt / a.steps * 1e3, "cpu_step_ms": dc / a.steps * 1e3,
               "steps": a.steps}, f)
