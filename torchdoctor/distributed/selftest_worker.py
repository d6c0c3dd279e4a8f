"""One rank of the collective self-test. Launched only through torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node N \
        -m torchdoctor.distributed.selftest_worker --out DIR [--backend nccl|gloo] [--sizes 1048576,...]

Each rank writes ``DIR/rank{R}.json`` (rewritten atomically after every phase, so a
crash or a kill keeps what was measured) and, if it is still running after
``--watchdog`` seconds, ``DIR/rank{R}.stack.txt`` (all Python thread stacks, faulthandler).

The rank file holds (units in the key names):
- ``phase``: the last phase entered ("init", "check:all_reduce", "sweep:1048576", "done");
- ``device``: name, uuid, pci_bus_id of the rank's GPU (NCCL only);
- ``checks``: one entry per collective: op, ok, max_abs_err, error;
- ``sweep``: one entry per message size: bytes, iters, rep_s (seconds per all-reduce, one
  per repetition; CUDA events on GPU, perf_counter on CPU);
- ``error``: the traceback text when the rank failed.
This module judges nothing; ``torchdoctor.distributed.selftest`` merges and ``rules`` judges.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

from torchdoctor.distributed.procs import die_with_parent
from torchdoctor.distributed.rankdir import NODE_ENV
from torchdoctor.distributed.timing import time_all_reduce

CHECK_NUMEL = (1 << 16) + 3  # odd on purpose: catches padding/chunking bugs


class RankRecord:
    """The rank's evidence file, rewritten atomically after each change."""

    def __init__(self, out: Path, rank: int):
        self.path = out / f"rank{rank}.json"
        self.data: dict = {}

    def update(self, **kv) -> None:
        self.data.update(kv)
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------- checks
def _expect_close(got, want) -> float:
    """Largest absolute difference between two tensors (exact values expected)."""
    return float((got.double() - want.double()).abs().max().item())


def check_all_reduce(dist, torch, rank: int, n: int, device) -> float:
    base = torch.arange(CHECK_NUMEL, dtype=torch.float32, device=device)
    t = base + rank
    dist.all_reduce(t)
    return _expect_close(t, base * n + n * (n - 1) / 2)


def check_all_gather(dist, torch, rank: int, n: int, device) -> float:
    base = torch.arange(CHECK_NUMEL, dtype=torch.float32, device=device)
    out = torch.empty(n * CHECK_NUMEL, dtype=torch.float32, device=device)
    dist.all_gather_into_tensor(out, base + 1000 * rank)
    want = torch.cat([base + 1000 * r for r in range(n)])
    return _expect_close(out, want)


def check_reduce_scatter(dist, torch, rank: int, n: int, device) -> float:
    full = torch.arange(n * CHECK_NUMEL, dtype=torch.float32, device=device)
    out = torch.empty(CHECK_NUMEL, dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(out, full + rank)
    chunk = full[rank * CHECK_NUMEL:(rank + 1) * CHECK_NUMEL]
    return _expect_close(out, chunk * n + n * (n - 1) / 2)


def check_broadcast(dist, torch, rank: int, n: int, device) -> float:
    src = n - 1  # a non-zero root catches root mix-ups
    base = torch.arange(CHECK_NUMEL, dtype=torch.float32, device=device)
    t = base + src if rank == src else torch.zeros_like(base)
    dist.broadcast(t, src=src)
    return _expect_close(t, base + src)


CHECKS = {
    "all_reduce": check_all_reduce,
    "all_gather": check_all_gather,
    "reduce_scatter": check_reduce_scatter,
    "broadcast": check_broadcast,
}


def injected_fault(rank: int, n: int) -> str | None:
    """Test hook: TORCHDOCTOR_SELFTEST_FAULT=hang|wrong|crash acts on the last rank only,
    =stall on every rank. Unset in normal use.

    hang: sleep instead of the first all_reduce (the others block in it until the
    process-group timeout); wrong: report a corrupted all_reduce result; crash: raise during
    init; stall: every rank sleeps before init (only the parent's timeout ends it).
    """
    fault = os.environ.get("TORCHDOCTOR_SELFTEST_FAULT", "")
    if fault == "stall":
        return fault
    return fault if fault in ("hang", "wrong", "crash") and rank == n - 1 else None


def run_checks(dist, torch, rec: RankRecord, rank: int, n: int, device) -> None:
    results = []
    fault = injected_fault(rank, n)
    for op, fn in CHECKS.items():
        rec.update(phase=f"check:{op}")
        entry = {"op": op, "ok": False, "max_abs_err": None, "error": None}
        if fault == "hang" and op == "all_reduce":
            time.sleep(3600)
        try:
            err = fn(dist, torch, rank, n, device)
            if fault == "wrong" and op == "all_reduce":
                err += 1.0
            entry.update(ok=err == 0.0, max_abs_err=err)
        except Exception as e:  # noqa: BLE001 - a failing collective is evidence
            entry["error"] = f"{type(e).__name__}: {e}"[:2000]
        results.append(entry)
        rec.update(checks=results)
        if entry["error"]:
            raise RuntimeError(f"{op} failed: {entry['error']}")


def iters_for(nbytes: int, cuda: bool) -> int:
    """Calls per timed repetition: enough work to dwarf launch and event overheads."""
    if not cuda:
        return 3
    if nbytes >= 256 << 20:
        return 10
    if nbytes >= 16 << 20:
        return 20
    return 50


def run_sweep(dist, torch, rec: RankRecord, sizes: list[int], device, warmup: int, reps: int) -> None:
    rows = []
    cuda = device.type == "cuda"
    for nbytes in sizes:
        rec.update(phase=f"sweep:{nbytes}")
        x = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: sums stay finite
        iters = iters_for(nbytes, cuda)
        rows.append({"bytes": nbytes, "iters": iters,
                     "rep_s": time_all_reduce(dist, torch, x, iters, warmup, reps)})
        del x
        rec.update(sweep=rows)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchdoctor.distributed.selftest_worker")
    p.add_argument("--out", required=True, help="folder for rank{R}.json")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--sizes", default="", help="comma-separated all-reduce sizes in bytes")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--pg-timeout", type=float, default=60.0, help="process-group timeout, s")
    p.add_argument("--watchdog", type=float, default=0.0, help="dump stacks after this many s")
    return p.parse_args(argv)


def device_facts(torch, index: int) -> dict:
    props = torch.cuda.get_device_properties(index)
    facts = {"index": index, "name": props.name}
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        facts["uuid"] = "GPU-" + str(uuid)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        facts["pci"] = {"domain": getattr(props, "pci_domain_id", 0), "bus": bus,
                        "device": getattr(props, "pci_device_id", 0)}
    return facts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = RankRecord(out, rank)
    rec.update(rank=rank, world_size=world, local_rank=local_rank, pid=os.getpid(),
               host=socket.gethostname(), phase="import")
    stack_file = None
    if args.watchdog > 0:
        stack_file = open(out / f"rank{rank}.stack.txt", "w")
        faulthandler.dump_traceback_later(args.watchdog, repeat=False, file=stack_file)
    t_start = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist

        backend = args.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        rec.update(backend=backend, torch=torch.__version__)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            rec.update(device=device_facts(torch, local_rank))
        else:
            device = torch.device("cpu")
        rec.update(phase="init")
        if injected_fault(rank, world) == "crash":
            raise RuntimeError("injected fault: crash during init (TORCHDOCTOR_SELFTEST_FAULT)")
        if injected_fault(rank, world) == "stall":
            time.sleep(3600)
        kw = {"backend": backend, "timeout": timedelta(seconds=args.pg_timeout)}
        if backend == "nccl":
            kw["device_id"] = device
        t0 = time.perf_counter()
        dist.init_process_group(**kw)
        dist.barrier()
        rec.update(init_s=time.perf_counter() - t0)
        run_checks(dist, torch, rec, rank, world, device)
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        run_sweep(dist, torch, rec, sizes, device, args.warmup, args.reps)
        if os.environ.get(NODE_ENV):  # a multi-node job: inside vs between nodes, then share
            from torchdoctor.distributed.selftest_nodes import node_sweep, share_records

            nb = max(sizes) if sizes else 1 << 20
            node_sweep(dist, torch, rec, device, nb, args.warmup, args.reps,
                       iters_for(nb, device.type == "cuda"))
            rec.update(phase="done", wall_s=time.perf_counter() - t_start)
            share_records(dist, rec, out)
        rec.update(phase="done", wall_s=time.perf_counter() - t_start)
        dist.destroy_process_group()
        return 0
    except BaseException as e:  # noqa: BLE001 - record, then fail the rank
        rec.update(error=traceback.format_exc()[-4000:], error_type=type(e).__name__,
                   wall_s=time.perf_counter() - t_start)
        return 1
    finally:
        if stack_file is not None:
            faulthandler.cancel_dump_traceback_later()
            stack_file.close()
            if not os.path.getsize(stack_file.name):
                os.unlink(stack_file.name)


if __name__ == "__main__":
    sys.exit(main())
