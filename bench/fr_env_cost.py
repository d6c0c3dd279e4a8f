"""What the Flight Recorder variables torchdoctor adds to a ranked launch cost the job (issue 30).

A 2-rank torchrun job (gloo on CPU; ``--backend nccl`` on a GPU host, one GPU per rank) runs
``--steps`` steps of a small matmul plus an ``all_reduce``; rank 0 times the steps after a
warm-up. Two environments, each round both (which goes first alternates), so a busy neighbour
slows both alike:

- ``plain``: none of the five variables set (what the user's job has without torchdoctor;
  torch's own buffer default then applies: 2000 entries in torch >= 2.6);
- ``fr``: exactly what :func:`torchdoctor.distributed.torchrun.flight_env` adds (buffer 2000 under
  both names, the dump pipe and the dump file in a private temp dir).

Per round the median step time of each; the overhead is the median over rounds of fr/plain.
Rank 0 also says how many entries its recorder holds at the end (``_dump_fr_trace_json``: the same
count in both modes means the recorder did the same work) and whether its dump pipe exists (only
ProcessGroupNCCL makes one).

    python bench/fr_env_cost.py [--rounds 3] [--steps 300] [--backend gloo|nccl] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKER = r"""
import os, sys, time, json
import torch, torch.distributed as dist
backend, steps, warm = sys.argv[1], int(sys.argv[2]), 20
dist.init_process_group(backend)
rank = dist.get_rank()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(dev)
torch.set_num_threads(1)
a = torch.randn(128, 128, device=dev)
g = torch.randn(4096, device=dev)
times = []
for i in range(steps + warm):
    t0 = time.perf_counter()
    b = a @ a
    dist.all_reduce(g)
    if backend == "nccl":
        torch.cuda.synchronize()
    if i >= warm:
        times.append(time.perf_counter() - t0)
if rank == 0:
    try:  # what the recorder kept (the same work in both modes when the counts agree)
        fr = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        entries = len(fr.get("entries") or [])
    except Exception as e:
        entries = f"{type(e).__name__}"
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    pipe = os.path.exists(f"{stem}0.pipe") if stem else None
    print("TIMES " + json.dumps({"times": times, "fr_entries": entries, "pipe_made": pipe}), flush=True)
dist.destroy_process_group()
"""
KEYS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def run(backend: str, steps: int, fr: bool, folder: Path) -> dict:
    from torchdoctor.distributed.torchrun import flight_env

    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    env["OMP_NUM_THREADS"] = "1"
    if fr:
        env.update(flight_env(env, folder))
    script = folder / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(script), backend, str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("TIMES "):
            return json.loads(line[6:])
    raise SystemExit(f"the job failed ({out.returncode}):\n{out.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="td-frbench-") as d:
        for i in range(a.rounds):
            if i % 2:  # which goes first alternates: a neighbour's load rising or falling hits both
                f = run(a.backend, a.steps, True, Path(d))
                p = run(a.backend, a.steps, False, Path(d))
            else:
                p = run(a.backend, a.steps, False, Path(d))
                f = run(a.backend, a.steps, True, Path(d))
            plain, fr = statistics.median(p["times"]) * 1e3, statistics.median(f["times"]) * 1e3
            rows.append({"round": i, "plain_ms": round(plain, 4), "fr_ms": round(fr, 4),
                         "ratio": round(fr / plain, 4), "fr_entries": [p["fr_entries"], f["fr_entries"]],
                         "pipe_made": f["pipe_made"]})
            print(f"round {i}: plain {plain:.3f} ms/step, with the variables {fr:.3f} ms/step, "
                  f"ratio {fr / plain:.3f}; recorder entries {p['fr_entries']} / {f['fr_entries']}, "
                  f"pipe made: {f['pipe_made']}", flush=True)
    ratio = statistics.median(r["ratio"] for r in rows)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    res = {"backend": a.backend, "steps": a.steps, "rounds": rows, "median_ratio": round(ratio, 4),
           "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load1": load,
                       "python": platform.python_version()}}
    print(f"median ratio (with / without): {ratio:.3f}")
    dest = a.json or (os.path.join(os.environ["OUT"], "fr_env_cost.json") if os.environ.get("OUT") else None)
    if dest:
        Path(dest).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
