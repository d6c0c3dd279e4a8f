"""Bench workload (b): a GPT-2-small-size decoder (12 layers, d=768, 12 heads, seq 1024,
vocab 50257, ~124M parameters) trained with bf16 autocast and AdamW on one GPU.

Batch from a pinned in-memory token tensor, copied with non_blocking. Times its own
steady-state steps: one torch.cuda.synchronize before and after the timed window (the same in
the bare and instrumented runs), none inside it. Writes {"step_ms", "steps", "tokens_per_s"}.
"""
import argparse
import json
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--result", required=True)
a = p.parse_args()
torch.manual_seed(0)
dev = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = True
V, D, H, L = 50257, 768, 12, 12


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(a.seq, D)
        layer = nn.TransformerEncoderLayer(D, H, 4 * D, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(a.seq),
                             persistent=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.tok(idx) + self.pos(pos)
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
data = torch.randint(0, V, (8, a.batch, a.seq + 1)).pin_memory()
t0 = None
for i in range(a.warmup + a.steps):
    if i == a.warmup:
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
    batch = data[i % 8].to(dev, non_blocking=True)
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, V), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dt, dc = time.perf_counter() - t0, time.thread_time() - c0
with open(a.result, "w") as f:
    json.dump({"step_ms": dt / a.steps * 1e3, "cpu_step_ms": dc / a.steps * 1e3,
               "steps": a.steps,
               "tokens_per_s": a.steps * a.batch * a.seq / dt,
               "params": sum(p.numel() for p in model.parameters())}, f)
