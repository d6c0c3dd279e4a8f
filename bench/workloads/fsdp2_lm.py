"""The FSDP2 decoder LM the FSDP2 benches launch on N ranks (torchrun, or torchdoctor's ranked probes).

``fully_shard`` per block and on the root; on GPU a bf16 ``MixedPrecisionPolicy`` (fp32 reduce) and
fused AdamW, d=1024, 8 layers, batch 8 x ``--seq`` tokens per rank; on CPU (``--cpu``: gloo) d=64,
2 layers, batch 4 x 32 (a smoke run of a bench, not a measurement). Modes:

* default: ``--steps`` training steps, nothing else (what a probe runs);
* ``--trace DIR``: the same steps under its own ``torch.profiler`` (wait 5, warm-up 1, active 3:
  the window torchdoctor's profile uses; CUDA activity, no Python stacks), each rank's Chrome trace
  written to ``DIR/plain.rank{R}.json``;
* ``--timed DIR``: ``--warmup`` steps, then ``--measure`` steps timed between a device sync and a
  barrier on each side, never inside; each rank writes ``DIR/ms.rank{R}.json``.

Used by bench/fsdp2_collectives.py and bench/fsdp2_overhead.py.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

ap = argparse.ArgumentParser()
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--seq", type=int, default=512)
ap.add_argument("--trace", default=None)
ap.add_argument("--timed", default=None)
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--measure", type=int, default=40)
a = ap.parse_args()

cpu = a.cpu
dist.init_process_group("gloo" if cpu else "nccl")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
if not cpu:
    torch.cuda.set_device(dev)
torch.set_num_threads(1)
torch.manual_seed(0)
d, layers, batch, t, vocab = (64, 2, 4, 32, 256) if cpu else (1024, 8, 8, a.seq, 32000)
model = nn.Sequential(nn.Embedding(vocab, d),
                      *[nn.TransformerEncoderLayer(d, max(1, d // 64), 4 * d, batch_first=True,
                                                   norm_first=True) for _ in range(layers)],
                      nn.LayerNorm(d), nn.Linear(d, vocab)).to(dev)
mesh = init_device_mesh(dev.type, (world,))
mp = MixedPrecisionPolicy() if cpu else MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                             reduce_dtype=torch.float32)
for layer in model[1:1 + layers]:
    fully_shard(layer, mesh=mesh, mp_policy=mp)
fully_shard(model, mesh=mesh, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not cpu)
ids = torch.randint(0, vocab, (batch, t), device=dev)


def step():
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def sync():
    if not cpu:
        torch.cuda.synchronize()
    dist.barrier()


if a.trace:
    from torch.profiler import ProfilerActivity, profile, schedule
    acts = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
    with profile(activities=acts, schedule=schedule(wait=5, warmup=1, active=3), record_shapes=True) as p:
        for _ in range(a.steps):
            step()
            p.step()
    p.export_chrome_trace(os.path.join(a.trace, f"plain.rank{rank}.json"))
elif a.timed:
    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.measure):
        step()
    sync()
    ms = (time.perf_counter() - t0) * 1000 / a.measure
    with open(os.path.join(a.timed, f"ms.rank{rank}.json"), "w") as f:
        json.dump({"ms_per_step": ms, "device": "cpu" if cpu else torch.cuda.get_device_name(dev)}, f)
else:
    for _ in range(a.steps):
        step()
dist.destroy_process_group()
