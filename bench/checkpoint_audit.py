"""Benchmark: `checkpoint-audit` of a ~2 GB torch.save checkpoint vs `cat FILE > /dev/null`.

Acceptance (issue 7): audit time ≤ 1.5 × cat time, peak RSS < 300 MB.

The checkpoint (model state_dict + AdamW moments, float32, ≈ 2 GiB) is written once to
/tmp. Each round, cold and warm:
  cold — the file's pages are dropped from the page cache (posix_fadvise DONTNEED on
         this file only; no root needed, other files untouched) before each command;
  warm — the file is read once first, so both commands read from the page cache.
Commands alternate (cat, audit, cat, audit, …) so a noisy shared disk hits both alike;
medians are reported. Peak RSS of the audit child comes from os.wait4 (ru_maxrss).

    .venv/bin/python bench/checkpoint_audit.py [--rounds 5] [--gib 2] [--keep]
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


def make_checkpoint(path: str, gib: float) -> None:
    import torch

    per = 4096 * 4096 * 4  # one 64 MiB float32 matrix
    n = max(1, int(gib * 2**30 / per / 3))  # weights + exp_avg + exp_avg_sq
    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.weight": torch.empty(4096, 4096).normal_(generator=g) for i in range(n)}
    sd.update({f"layers.{i}.bias": torch.zeros(4096) for i in range(n)})
    state = {i: {"step": torch.tensor(10.0), "exp_avg": torch.empty_like(t).normal_(generator=g) * 1e-3,
                 "exp_avg_sq": torch.empty_like(t).uniform_(generator=g) * 1e-6}
             for i, t in enumerate(sd.values()) if t.dim() == 2}
    groups = [{"lr": 1e-3, "initial_lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
               "params": list(range(len(sd)))}]
    ckpt = {"model": sd, "optimizer": {"state": state, "param_groups": groups},
            "scheduler": {"last_epoch": 10, "base_lrs": [1e-3], "_last_lr": [1e-3], "_step_count": 11},
            "epoch": 1, "global_step": 10, "rng": {"torch": torch.get_rng_state()}}
    torch.save(ckpt, path)


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(cmd: list[str], shell: bool = False) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in bytes, exit code) of one child process."""
    t0 = time.perf_counter()
    if shell:
        p = subprocess.Popen(cmd[0], shell=True)
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    _pid, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return dt, ru.ru_maxrss * 1024, p.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--path", default="/tmp/torchdoctor-bench-2g.pt")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for the next run")
    args = ap.parse_args()
    if not os.path.exists(args.path):
        t0 = time.perf_counter()
        # in a child: a 2 GiB parent would be counted in every forked child's ru_maxrss
        code = f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import checkpoint_audit as b; " \
               f"b.make_checkpoint({args.path!r}, {args.gib})"
        subprocess.run([sys.executable, "-c", code], check=True)
        print(f"wrote {args.path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    size = os.path.getsize(args.path)
    audit = [sys.executable, "-m", "torchdoctor", "checkpoint-audit", args.path, "--json"]
    cat = [f"cat {args.path} > /dev/null"]
    results: dict[str, dict[str, list]] = {m: {"cat": [], "audit": [], "rss": []} for m in ("cold", "warm")}
    for r in range(args.rounds):
        for mode in ("cold", "warm"):
            if mode == "warm":
                timed(cat, shell=True)
            for which in ("cat", "audit"):
                if mode == "cold":
                    drop_cache(args.path)
                dt, rss, rc = timed(cat, shell=True) if which == "cat" else timed(audit)
                if which == "audit":
                    if rc not in (0, 1):
                        print(f"audit failed with exit code {rc}", file=sys.stderr)
                        return 1
                    results[mode]["rss"].append(rss)
                results[mode][which].append(dt)
        print(f"round {r + 1}: cold cat {results['cold']['cat'][-1]:.2f} s audit {results['cold']['audit'][-1]:.2f} s"
              f" | warm cat {results['warm']['cat'][-1]:.2f} s audit {results['warm']['audit'][-1]:.2f} s",
              file=sys.stderr)
    out = {"file_bytes": size, "rounds": args.rounds, "machine": f"{os.cpu_count()} CPUs"}
    for mode, d in results.items():
        c, a = statistics.median(d["cat"]), statistics.median(d["audit"])
        out[mode] = {"cat_s": round(c, 3), "audit_s": round(a, 3), "ratio": round(a / c, 2),
                     "audit_peak_rss_mb": round(max(d["rss"]) / 2**20, 1),
                     "cat_all_s": [round(x, 3) for x in d["cat"]], "audit_all_s": [round(x, 3) for x in d["audit"]]}
    out["acceptance"] = {"ratio_cold_le_1.5": out["cold"]["ratio"] <= 1.5,
                         "peak_rss_lt_300mb": max(out["cold"]["audit_peak_rss_mb"],
                                                  out["warm"]["audit_peak_rss_mb"]) < 300}
    print(json.dumps(out, indent=2))
    if not args.keep:
        os.unlink(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
