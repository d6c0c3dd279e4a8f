"""Self-test all-reduce timing vs a plain `torch.distributed.all_reduce` loop, side by side.

    python bench/dist_allreduce.py [--nproc-per-node N] [--size 1G] [--rounds 3] [--backend nccl|gloo]

The parent launches this file under torchrun (NVLink multicast off). Every rank, in the
same processes and alternating ``--rounds`` times, times one all-reduce size two ways:
- selftest: ``torchdoctor.distributed.timing.time_all_reduce`` (CUDA events, barrier,
  warm-up, median of repetitions) — what `torchdoctor dist` reports;
- plain: ``synchronize; perf_counter; for _ in range(iters): dist.all_reduce(x); synchronize``.
Times are averaged over ranks, busbw = bytes/time * 2(n-1)/n (nccl-tests). Rank 0 prints
both and ``ratio = selftest / plain``; acceptance (issue 8) is |1 - ratio| <= 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def plain_loop(dist, torch, x, iters: int, warmup: int, reps: int) -> list[float]:
    """Seconds per all-reduce, host-timed around a bare loop: the baseline."""
    for _ in range(warmup):
        dist.all_reduce(x)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        out.append((time.perf_counter() - t0) / iters)
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from torchdoctor.distributed.busbw import allreduce_bandwidth
    from torchdoctor.distributed.selftest_worker import iters_for
    from torchdoctor.distributed.timing import time_all_reduce

    local = int(os.environ["LOCAL_RANK"])
    if args.backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    n = dist.get_world_size()
    x = torch.zeros(args.size // 4, dtype=torch.float32, device=device)
    iters = iters_for(args.size, device.type == "cuda")
    res = {"selftest": [], "plain": []}
    for _ in range(args.rounds):
        res["selftest"].append(statistics.median(time_all_reduce(dist, torch, x, iters, 5, 5)))
        res["plain"].append(statistics.median(plain_loop(dist, torch, x, iters, 5, 5)))
    # mean over ranks of each round's time, as the self-test merges
    t = torch.tensor(res["selftest"] + res["plain"], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t = (t / n).tolist()
    k = args.rounds
    if dist.get_rank() == 0:
        rows = {}
        for name, times in (("selftest", t[:k]), ("plain", t[k:])):
            best = statistics.median(times)
            rows[name] = {"time_us_rounds": [round(v * 1e6, 1) for v in times],
                          "time_us": round(best * 1e6, 1),
                          "busbw_gbs": round(allreduce_bandwidth(args.size, best, n)[1], 2)}
        rows["ratio"] = round(rows["selftest"]["busbw_gbs"] / rows["plain"]["busbw_gbs"], 4)
        rows.update(size=args.size, ranks=n, backend=args.backend, iters=iters, rounds=k,
                    device=torch.cuda.get_device_name(local) if device.type == "cuda" else "cpu",
                    torch=torch.__version__)
        Path(args.result).write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--size", type=parse_size, default=1 << 30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", default=None, choices=("nccl", "gloo"))
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    import torch

    from torchdoctor.distributed.selftest import child_env, kill_group

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    args.backend = args.backend or ("nccl" if gpus >= 2 else "gloo")
    n = args.nproc_per_node or (gpus if args.backend == "nccl" else 2)
    result = Path(f"/tmp/torchdoctor-bench-dist-{os.getpid()}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           __file__, "--worker", "--backend", args.backend, "--size", str(args.size),
           "--rounds", str(args.rounds), "--result", str(result)]
    proc = subprocess.Popen(cmd, env=child_env(), start_new_session=True)
    try:
        rc = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        print("bench: timed out", file=sys.stderr)
        return 1
    if rc != 0 or not result.is_file():
        print(f"bench: torchrun failed (exit {rc})", file=sys.stderr)
        return 1
    rows = json.loads(result.read_text())
    result.unlink()
    print(json.dumps(rows, indent=1))
    print(f"{rows['ranks']} x {rows['device']} ({rows['backend']}), all-reduce {rows['size'] / 2**20:g} MiB: "
          f"selftest {rows['selftest']['busbw_gbs']} GB/s busbw, plain loop {rows['plain']['busbw_gbs']} GB/s, "
          f"ratio {rows['ratio']:.3f} ({'within' if abs(1 - rows['ratio']) <= 0.10 else 'OUTSIDE'} 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
