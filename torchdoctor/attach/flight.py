"""NCCL Flight Recorder of a running job, when the job was started with it.

A rank started with ``TORCH_NCCL_TRACE_BUFFER_SIZE=N`` (N > 0) and
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=STEM`` opens a named pipe ``STEM{rank}.pipe``; writing to it makes
the rank's NCCL watchdog write its trace (the last N collectives) to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (default ``/tmp/nccl_trace_rank_``) + rank. No signal is sent:
the pipe is the rank's own, read by its own thread.

The dump is a pickle of plain containers; it is read with an unpickler that refuses every global
(nothing in it is executed), and reduced to what the report needs: per rank the last completed
collective and the first that is not (sequence number, op, sizes, state).
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import time

DEFAULT_DUMP_STEM = "/tmp/nccl_trace_rank_"
WAIT_S = 5.0  # how long a rank may take to write its dump after the pipe write
MAX_DUMP_BYTES = 256 * 1024 * 1024

HOW_TO_ENABLE = ("start the next run with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                 "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/torchdoctor_fr_ (NCCL jobs) so that attach can "
                 "read the last collectives of every rank")


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: D401 - refuse code
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load_dump(raw: bytes):
    """The dump's containers (dict), or the JSON form some versions write."""
    if raw[:1] in (b"{", b"["):
        import json

        return json.loads(raw.decode("utf-8", "replace"))
    return _NoGlobals(io.BytesIO(raw)).load()


def summarise(dump: dict) -> dict:
    """Last completed and first pending collective of one rank's dump."""
    entries = [e for e in (dump.get("entries") or []) if isinstance(e, dict)]
    done = [e for e in entries if e.get("state") == "completed"]
    pending = [e for e in entries if e.get("state") in ("scheduled", "started")]

    def brief(e: dict | None) -> dict | None:
        if e is None:
            return None
        pg = e.get("process_group")
        return {"seq": e.get("collective_seq_id"), "op": str(e.get("profiling_name", "?")),
                "state": e.get("state"), "pg": list(pg) if isinstance(pg, (list, tuple)) else pg,
                "input_sizes": e.get("input_sizes"), "output_sizes": e.get("output_sizes")}

    return {"version": str(dump.get("version", "?")), "entries": len(entries),
            "last_completed": brief(done[-1] if done else None),
            "first_pending": brief(pending[0] if pending else None)}


def enabled(env: dict) -> bool:
    try:
        size = int(env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))
    except ValueError:
        size = 0
    return size > 0 and bool(env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"))


def trigger_and_read(env: dict, rank: int) -> dict:
    """Write to the rank's pipe and read its dump; {"error": ...} when it cannot."""
    pipe = f"{env['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    out_path = f"{env.get('TORCH_NCCL_DEBUG_INFO_TEMP_FILE') or DEFAULT_DUMP_STEM}{rank}"
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            return {"error": f"{pipe} is not a named pipe"}
        before = os.stat(out_path).st_mtime if os.path.exists(out_path) else None
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # no reader: ENXIO, never blocks
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
    except OSError as e:
        return {"error": f"could not trigger the dump through {pipe}: {e.strerror or e}"}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            st = os.stat(out_path)
            if (before is None or st.st_mtime > before) and st.st_size > 0:
                time.sleep(0.2)  # let the writer finish
                break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        return {"error": f"rank {rank} wrote no dump to {out_path} within {WAIT_S:g} s"}
    try:
        if os.path.getsize(out_path) > MAX_DUMP_BYTES:
            return {"error": f"{out_path} is larger than {MAX_DUMP_BYTES >> 20} MiB"}
        with open(out_path, "rb") as f:
            data = load_dump(f.read())
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as e:
        return {"error": f"could not read {out_path}: {e}"}
    if not isinstance(data, dict):
        return {"error": f"{out_path}: not a Flight Recorder dump"}
    return {"file": out_path, **summarise(data)}
