"""The NCCL Flight Recorder's own trigger and dump format, shared by ``attach`` (a job someone else
started) and the ranked runs torchdoctor launches (never imports torch).

A rank started with ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=STEM`` and a trace buffer > 0 makes a named
pipe ``STEM{global rank}.pipe`` (``DumpPipe`` in torch's ProcessGroupNCCL.hpp: unlink, mkfifo,
opened O_RDONLY|O_NONBLOCK and polled by the rank's NCCL watchdog); one line written to it makes
the rank write its trace through its ``DebugInfoWriter`` to ``TORCH_FR_DUMP_TEMP_FILE`` (or the
older ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) + rank. :func:`poke` writes that line without ever
waiting (no reader: ENXIO). Only ProcessGroupNCCL makes the pipe: a gloo job has none.

The dump is a pickle written by torch's own (TorchScript) pickler: plain containers, number
lists wrapped in ``torch.jit._pickle.build_intlist`` & co., typed dicts in ``restore_type_tag``.
:func:`load_dump` maps exactly those to an identity function and refuses every other global
(nothing in it is executed); some versions write JSON, read as such.
"""

from __future__ import annotations

import io
import os
import pickle
import stat

PIPE_KEY = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
BUFFER_KEYS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # newer name first
DUMP_KEYS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
MAX_DUMP_BYTES = 256 * 1024 * 1024


def _same(data, *_):
    return data


# the only globals torch's pickler writes into a trace: identity wrappers around plain values
# (torch/jit/_pickle.py: build_intlist(data) returns data; restore_type_tag(value, type_str) returns value)
_SAFE = {("torch.jit._pickle", n): _same for n in
         ("build_intlist", "build_doublelist", "build_boollist", "restore_type_tag")}


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: D401 - refuse code
        fn = _SAFE.get((module, name))
        if fn is None:
            raise pickle.UnpicklingError(f"global {module}.{name} refused")
        return fn


def load_dump(raw: bytes):
    """The dump's containers (dict), or the JSON form some versions write."""
    if raw[:1] in (b"{", b"["):
        import json

        return json.loads(raw.decode("utf-8", "replace"))
    return _NoGlobals(io.BytesIO(raw)).load()


def read_dump(path: str | os.PathLike) -> dict | None:
    """A dump file → its dict; None when absent, too large or not a Flight Recorder dump."""
    try:
        if os.path.getsize(path) > MAX_DUMP_BYTES:
            return None
        with open(path, "rb") as f:
            data = load_dump(f.read())
    except (OSError, pickle.UnpicklingError, ValueError, EOFError, IndexError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def pipe_path(stem: str, rank: int) -> str:
    return f"{stem}{rank}.pipe"


def poke(pipe: str) -> str | None:
    """Ask the rank behind ``pipe`` for a dump; None when written, else why not. Never blocks."""
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            return f"{pipe} is not a named pipe"
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # no reader: ENXIO, never blocks
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
    except OSError as e:
        return f"could not trigger the dump through {pipe}: {e.strerror or e}"
    return None
