"""In-step overhead of ``checkup`` on an FSDP2 decoder LM, side by side with the bare script,
on N ranks (issue 29: ≤ 1.05x on 2×H200).

The workload (bench/workloads/fsdp2_lm.py ``--timed``) times its own steady state: ``--measure`` optimizer
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

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "fsdp2_lm.py"


def run(cfg: str, work: Path, args) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"fsdp2-{cfg}-", dir=work))
    tail = [str(WORKLOAD), "--seq", "1024", "--timed", str(out), "--warmup", str(args.warmup),
            "--measure", str(args.measure), *(["--cpu"] if args.cpu else [])]
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
