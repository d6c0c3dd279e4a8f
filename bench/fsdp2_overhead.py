"""In-step overhead of ``checkup`` on an FSDP2 decoder LM, side by side with the bare script,
on N ranks (issue 29: ≤ 1.05x on 2×H200).

The workload (written to a temp folder) times its own steady state: ``--measure`` optimizer
steps after ``--warmup``, one device sync and a barrier before and after the timed block, never
inside it; each rank writes its ms/step. Configurations, run alternately ``--rounds`` times so a
busy neighbour slows all alike:

* ``bare``     python -m torch.distributed.run --nproc-per-node N workload.py
* ``checkup``  python -m torchdoctor checkup --nproc-per-node N workload.py

GPU: ``fully_shard`` per block and on the root, bf16 ``MixedPrecisionPolicy`` (fp32 reduce),
fused AdamW, d=1024, 8 layers, batch 8 x 1024 tokens per rank. CPU (``--cpu``, gloo, a smoke
run of the bench itself, not a measurement of GPU overhead): d=64, 2 layers, batch 4 x 32.

    python bench/fsdp2_overhead.py --nproc 2 --rounds 5          # on a 2-GPU machine
    python bench/fsdp2_overhead.py --cpu --nproc 2 --rounds 1 --warmup 2 --measure 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKLOAD = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import torch.nn as nn, torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

out, warmup, measure, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "cpu"
dist.init_process_group("gloo" if cpu else "nccl")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
if not cpu:
    torch.cuda.set_device(dev)
torch.manual_seed(0)
d, layers, batch, t, vocab = (64, 2, 4, 32, 256) if cpu else (1024, 8, 8, 1024, 32000)
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

for _ in range(warmup):
    step()
sync()
t0 = time.perf_counter()
for _ in range(measure):
    step()
sync()
ms = (time.perf_counter() - t0) * 1000 / measure
with open(os.path.join(out, f"ms.rank{rank}.json"), "w") as f:
    json.dump({"ms_per_step": ms, "device": torch.cuda.get_device_name(dev) if not cpu else "cpu"}, f)
dist.destroy_process_group()
'''


def run(cfg: str, work: Path, args) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"fsdp2-{cfg}-", dir=work))
    tail = [str(work / "workload.py"), str(out), str(args.warmup), str(args.measure),
            "cpu" if args.cpu else "gpu"]
    if cfg == "bare":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.nproc}", *tail]
    else:
        cmd = [sys.executable, "-m", "torchdoctor", cfg, "--nproc-per-node", str(args.nproc),
               "--steps", "0", "--timeout", "900", *tail]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    rows = [json.loads((out / f"ms.rank{r}.json").read_text()) for r in range(args.nproc)
            if (out / f"ms.rank{r}.json").exists()]
    if len(rows) != args.nproc:
        raise SystemExit(f"{cfg}: no timing from every rank (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return {"ms": max(r["ms_per_step"] for r in rows), "device": rows[0]["device"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--measure", type=int, default=40)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsdp2-bench-"))
    (work / "workload.py").write_text(WORKLOAD)
    times: dict[str, list[float]] = {"bare": [], "checkup": []}
    device = "?"
    for i in range(args.rounds):
        for cfg in (("bare", "checkup") if i % 2 == 0 else ("checkup", "bare")):
            got = run(cfg, work, args)
            times[cfg].append(got["ms"])
            device = got["device"]
            print(f"round {i + 1} {cfg}: {got['ms']:.2f} ms/step (slowest rank)", flush=True)
    bare, chk = statistics.median(times["bare"]), statistics.median(times["checkup"])
    print(json.dumps({"device": device, "nproc": args.nproc, "rounds": args.rounds,
                      "bare_ms": times["bare"], "checkup_ms": times["checkup"],
                      "median_bare_ms": round(bare, 3), "median_checkup_ms": round(chk, 3),
                      "ratio": round(chk / bare, 4)}, indent=1))


if __name__ == "__main__":
    main()
