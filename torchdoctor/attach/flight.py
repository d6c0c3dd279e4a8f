"""NCCL Flight Recorder of a running job, when the job was started with it.

A rank started with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=STEM`` and a trace buffer (``TORCH_FR_BUFFER_SIZE``
or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0; torch 2.13's default is 2000, older versions' 0) opens a
named pipe ``STEM{global rank}.pipe`` (``DumpPipe`` in torch's ProcessGroupNCCL.hpp: mkfifo, opened
O_RDONLY|O_NONBLOCK, polled by the rank's NCCL watchdog); writing to it makes the rank write its
trace (the last N collectives) through its ``DebugInfoWriter``. No signal is sent: the pipe is the
rank's own, read by its own thread.

Where the dump goes changed across torch versions: ``TORCH_FR_DUMP_TEMP_FILE`` or
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank when set; otherwise ``/tmp/nccl_trace_rank_`` (older),
``$HOME/.cache/torch/nccl_trace_rank_``, then ``${XDG_CACHE_HOME:-$HOME/.cache}/torch/comm_lib_trace_rank_``
(2.13's FlightRecorder: the strings in libtorch_cpu.so). Every candidate is watched and the one
written after the trigger is read.

The dump is a pickle written by torch's own (TorchScript) pickler: plain containers, int/float/bool
lists wrapped in ``torch.jit._pickle.build_intlist`` & co. and dicts in ``restore_type_tag``. It is
read with an unpickler that maps exactly those to pure functions here and refuses every other
global (nothing in it is executed, torch is not imported), and reduced to what the report needs: per
rank the last completed collective and the first that is not (sequence number, op, sizes, state).
"""

from __future__ import annotations

import os
import stat
import time

from torchdoctor.distributed import frpipe
from torchdoctor.distributed.frpipe import BUFFER_KEYS, DUMP_KEYS, MAX_DUMP_BYTES, load_dump  # noqa: F401

DEFAULT_DUMP_STEM = "/tmp/nccl_trace_rank_"  # torch <= 2.5; see dump_candidates for the others
WAIT_S = 10.0  # how long a rank may take to write its dump after the pipe write

HOW_TO_ENABLE = ("start the next run with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                 "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/torchdoctor_fr_ (NCCL jobs) so that attach can "
                 "read the last collectives of every rank (runs that torchdoctor launches have both)")


def _brief(e: dict | None) -> dict | None:
    if e is None:
        return None
    pg = e.get("process_group")
    return {"seq": e.get("collective_seq_id"), "op": str(e.get("profiling_name", "?")),
            "state": e.get("state"), "pg": list(pg) if isinstance(pg, (list, tuple)) else pg,
            "input_sizes": e.get("input_sizes"), "output_sizes": e.get("output_sizes")}


def _pg_name(e: dict) -> str:
    pg = e.get("process_group")
    return str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "?"))


def _seq(e: dict) -> int:
    s = e.get("collective_seq_id")
    return s if isinstance(s, int) else -1


def summarise(dump: dict) -> dict:
    """Last completed and first pending collective of one rank's dump, per process group (sequence
    numbers count per group; point-to-point ops are left out: they count apart), and at the top
    those of the default group ("0"), else of the group with the most entries."""
    entries = [e for e in (dump.get("entries") or []) if isinstance(e, dict) and not e.get("is_p2p")]
    pgs: dict[str, dict] = {}
    for name in sorted({_pg_name(e) for e in entries}):
        mine = [e for e in entries if _pg_name(e) == name]
        done = [e for e in mine if e.get("state") == "completed"]
        pending = [e for e in mine if e.get("state") in ("scheduled", "started")]
        pgs[name] = {"entries": len(mine),
                     "last_completed": _brief(max(done, key=_seq) if done else None),
                     "first_pending": _brief(min(pending, key=_seq) if pending else None)}
    main = "0" if "0" in pgs else max(pgs, key=lambda n: pgs[n]["entries"], default=None)
    top = pgs.get(main) or {"last_completed": None, "first_pending": None}
    return {"version": str(dump.get("version", "?")), "entries": len(entries), "pg": main,
            "last_completed": top["last_completed"], "first_pending": top["first_pending"],
            "pgs": pgs}


def _buffer_size(env: dict) -> int | None:
    for k in BUFFER_KEYS:
        if k in env:
            try:
                return int(env[k])
            except ValueError:
                return 0
    return None  # unset: the version's default (2000 in torch 2.13, 0 before)


def pipe_path(env: dict, rank: int) -> str:
    return frpipe.pipe_path(env.get(frpipe.PIPE_KEY, ""), rank)


def enabled(env: dict, rank: int | None = None) -> bool:
    """The rank can be asked for a dump: a pipe stem and a trace buffer. With the buffer size unset
    (the version's default decides), the pipe itself is the evidence: the rank made it."""
    if not env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        return False
    size = _buffer_size(env)
    if size is not None:
        return size > 0
    if rank is None:
        return False
    try:
        return stat.S_ISFIFO(os.stat(pipe_path(env, rank)).st_mode)
    except OSError:
        return False


def dump_candidates(env: dict, rank: int) -> list[str]:
    """Where the rank may write its dump (its own environment's variables, newest name first)."""
    for k in DUMP_KEYS:
        if env.get(k):
            return [f"{env[k]}{rank}"]
    home = env.get("HOME") or "/tmp"
    cache = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return [os.path.join(cache, "torch", f"comm_lib_trace_rank_{rank}"),
            os.path.join(home, ".cache", "torch", f"nccl_trace_rank_{rank}"),
            f"{DEFAULT_DUMP_STEM}{rank}"]


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _wait_written(paths: list[str], before: dict, wait_s: float) -> str | None:
    """The first candidate written after the trigger, once its size stopped changing."""
    deadline = time.monotonic() + wait_s
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        for p in paths:
            m = _mtime(p)
            if m is None or m == before.get(p):
                continue
            try:
                size = os.path.getsize(p)
            except OSError:
                continue
            if size > 0 and seen.get(p) == size:
                return p
            seen[p] = size
        time.sleep(0.1)
    return None


def trigger_and_read(env: dict, rank: int, wait_s: float = WAIT_S) -> dict:
    """Write to the rank's pipe and read its dump; {"error": ...} when it cannot."""
    pipe = pipe_path(env, rank)
    paths = dump_candidates(env, rank)
    before = {p: _mtime(p) for p in paths}
    why = frpipe.poke(pipe)
    if why is not None:
        return {"error": why}
    out_path = _wait_written(paths, before, wait_s)
    if out_path is None:
        return {"error": f"rank {rank} wrote no dump to {' or '.join(paths)} within {wait_s:g} s"}
    data = frpipe.read_dump(out_path)
    if data is None:
        return {"error": f"could not read {out_path} as a Flight Recorder dump (at most "
                         f"{MAX_DUMP_BYTES >> 20} MiB)"}
    return {"file": out_path, **summarise(data)}
