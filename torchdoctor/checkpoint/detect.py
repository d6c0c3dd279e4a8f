"""Open a checkpoint path: sniff its format from its bytes and hand it to the right reader.

Files: torch.save zip, legacy torch.save, safetensors, a plain pickle, a Hugging Face
``*.index.json`` of shards. Directories: DCP (``.metadata``), a folder with an index of
shards, a Hugging Face Trainer ``checkpoint-N/`` folder (model + optimizer.pt +
scheduler.pt + rng_state.pth + trainer_state.json …) read as one checkpoint, or a folder
holding exactly one checkpoint file. The file extension is never trusted over the bytes.
This module reads one file, and a shard index with its shards; folders are read by ``folders.py``,
and :func:`torchdoctor.checkpoint.reader.read` opens either.
"""

from __future__ import annotations

import json
import os
import stat
from collections import OrderedDict
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import kind, not_regular, open_regular
from torchdoctor.checkpoint.limits import MAX_FILES, MAX_JSON, MAX_PICKLE, MAX_SNIFF_PICKLE, PARTIAL_SCAN
from torchdoctor.checkpoint.values import Contents, brief
from torchdoctor.errors import DoctorError
from torchdoctor.safe import visible

_MAGIC = [
    (b"GGUF", "GGUF file (llama.cpp), not a PyTorch checkpoint"),
    (b"\x89HDF\r\n\x1a\n", "HDF5 file (Keras/h5py), not a PyTorch checkpoint"),
    (b"\x93NUMPY", "numpy .npy array, not a PyTorch checkpoint"),
    (b"\x1f\x8b", "gzip-compressed data: decompress it first"),
    (b"version https://git-lfs", "a Git LFS pointer file: the real checkpoint was never downloaded (git lfs pull)"),
]


def check_path(path: str) -> None:
    """Usage errors (exit 2): the path is missing, not a file or folder, or cannot be opened at all."""
    shown = visible(path)
    if not os.path.lexists(path):
        raise DoctorError(f"ckpt-unreadable: no such file or directory: {shown}",
                          hint="check the path; a checkpoint is a file or a DCP/Hugging Face folder")
    if not os.path.exists(path):
        raise DoctorError(f"ckpt-unreadable: broken symbolic link: {shown}")
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise DoctorError(f"ckpt-unreadable: cannot stat {shown}: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode) and not stat.S_ISREG(mode):
        raise DoctorError(f"ckpt-unreadable: {shown} is {kind(mode)}, not a checkpoint file",
                          hint="pass a regular file or a checkpoint folder (reading a pipe or device could "
                               "block forever)")
    try:
        if stat.S_ISDIR(mode):
            os.listdir(path)
        else:
            with open_regular(path) as f:
                f.read(1)
    except PermissionError:
        raise DoctorError(f"ckpt-unreadable: permission denied: {shown}",
                          hint="run as a user who may read it, or copy it somewhere readable") from None
    except OSError as e:
        raise DoctorError(f"ckpt-unreadable: cannot open {shown}: {visible(e.strerror or e)}") from None


def prefetch(path: str) -> None:
    """Ask the kernel to start reading the file's head now: the disk works while Python parses."""
    from torchdoctor.checkpoint.scan import AHEAD

    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, AHEAD, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass


def _sniff(path: str) -> tuple[str, bytes, int]:
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(64)
    if size == 0:
        raise Unreadable("empty file", "0 bytes (an interrupted save, or a placeholder)", path)
    from torchdoctor.checkpoint.safetensors import looks_safetensors
    from torchdoctor.checkpoint.torch_legacy import looks_legacy

    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "torch-zip", head, size
    if looks_legacy(head):
        return "torch-legacy", head, size
    if looks_safetensors(head, size):
        return "safetensors", head, size
    if size >= 262 and _is_tar(path):
        return "tar", head, size
    if head[:1] == b"\x80" and len(head) > 1 and 0 < head[1] <= 5:
        return "pickle", head, size
    if head.lstrip()[:1] == b"{":
        return "json", head, size
    if size <= MAX_SNIFF_PICKLE and _parses_as_pickle(path, size):
        return "pickle", head, size  # protocol 0/1 pickles have no PROTO opcode to sniff
    return "unknown", head, size


def _read_bounded(path: str, limit: int) -> bytes:
    with open_regular(path) as f:
        return f.read(limit)


def _parses_as_pickle(path: str, size: int) -> bool:
    """A protocol 0/1 pickle to its end; or a broken one that already names code-running globals."""
    from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
    from torchdoctor.checkpoint.pickle_globals import dangerous

    raw = _read_bounded(path, size)
    try:
        info, end = scan_pickle(raw, path, record=False)
    except PickleScanError as e:
        # pickle.load would run these before failing: judge the file as a (broken) pickle
        return e.partial is not None and any(dangerous(g) for g in e.partial.globals if not g.startswith("<"))
    return end >= size - 2


def _is_tar(path: str) -> bool:
    with open_regular(path) as f:
        f.seek(257)
        return f.read(5) == b"ustar"


def _unknown(path: str, head: bytes, size: int) -> Unreadable:
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return Unreadable("not a PyTorch checkpoint", what, path)
    if not any(head):
        return Unreadable("zero-filled file", f"{size} bytes, starting with zeros (a preallocated or wiped file)", path)
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in head) / max(1, len(head))
    kind = "text" if printable > 0.95 else "random or unknown bytes"
    return Unreadable("unknown format",
                      f"{kind}: first bytes {head[:8].hex(' ')} are not a zip (torch.save), a legacy torch.save "
                      "pickle, a safetensors header or a JSON shard index", path)


def read_file(path: str, allow_index: bool = True) -> Contents:
    fmt, head, size = _sniff(path)
    if fmt == "json" and not allow_index:  # a shard that is itself an index: never recurse
        raise Unreadable("not a checkpoint", "a JSON file where a weights shard was expected", path)
    c = Contents(path=path, format=fmt, files=[{"path": path, "bytes": size, "format": fmt}])
    if fmt in ("torch-zip", "torch-legacy", "pickle"):
        c.root = _read_pickled(path, fmt, c)
    elif fmt == "safetensors":
        from torchdoctor.checkpoint.safetensors import read_safetensors

        c.root, c.metadata = read_safetensors(path)
    elif fmt == "json":
        read_index(path, c)
    elif fmt == "tar":
        if _is_tar(path):
            raise Unreadable("legacy tar checkpoint", "PyTorch < 0.4 tar format: re-save it with a current torch", path)
        raise _unknown(path, head, size)
    else:
        raise _unknown(path, head, size)
    return c


def _read_pickled(path: str, fmt: str, c: Contents) -> Any:
    if fmt == "torch-zip":
        from torchdoctor.checkpoint.torch_zip import read_torch_zip

        z = read_torch_zip(path)
    elif fmt == "torch-legacy":
        from torchdoctor.checkpoint.torch_legacy import read_torch_legacy

        z = read_torch_legacy(path)
    else:
        z = _read_plain_pickle(path)
    c.pickles.append(z.pickle)
    c.problems.extend({"what": os.path.basename(path), "reason": p} for p in z.problems)
    return z.root


def _read_plain_pickle(path: str):
    from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
    from torchdoctor.checkpoint.stub_unpickler import stub_load
    from torchdoctor.checkpoint.torch_zip import ZipRead

    size = os.path.getsize(path)
    if size > MAX_PICKLE:  # bounded: only the head is read, and scanned for what it imports
        raw = _read_bounded(path, PARTIAL_SCAN)
        try:
            scan_pickle(raw, path)
        except PickleScanError as e:
            raise Unreadable("oversized pickle", f"{size} bytes, above the {MAX_PICKLE >> 20} MiB limit for a "
                             f"plain pickle (the first {PARTIAL_SCAN >> 20} MiB were scanned for globals)", path,
                             pickles=[e.partial] if e.partial else []) from None
    raw = _read_bounded(path, MAX_PICKLE)
    try:
        info, _ = scan_pickle(raw, path)
    except PickleScanError as e:
        raise Unreadable("corrupt pickle", visible(e), path, pickles=[e.partial] if e.partial else []) from None
    try:
        root = stub_load(raw)
    except Exception as e:  # noqa: BLE001 - a crafted pickle can fail in any way
        raise Unreadable("corrupt pickle", f"{type(e).__name__}: {brief(str(e), 200)}", path,
                         pickles=[info]) from None
    info.unsupported_ops = info.unsupported_ops or ["(not written by torch.save)"]
    return ZipRead(root=root, pickle=info)


def read_index(path: str, c: Contents) -> None:
    """A Hugging Face ``*.index.json``: ``{"metadata": {...}, "weight_map": {key: shard file}}``."""
    idx = load_json(path)
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise Unreadable("not a checkpoint", "JSON file without a weight_map (not a shard index)", path)
    c.format = "hf-index"
    c.metadata = idx.get("metadata") if isinstance(idx.get("metadata"), dict) else {}
    folder = os.path.dirname(os.path.abspath(path))
    merged: OrderedDict = OrderedDict()
    shards = list(OrderedDict.fromkeys(str(v) for v in wm.values()))
    for shard in shards[:MAX_FILES]:
        spath = os.path.join(folder, shard)
        if "\x00" in shard or os.path.dirname(os.path.normpath(spath)) != os.path.normpath(folder):
            c.problems.append({"what": shard, "reason": "shard path leaves the index's folder"})
            continue
        if not os.path.lexists(spath):
            c.problems.append({"what": shard, "reason": "shard listed in the index is missing"})
            continue
        sub = read_part(spath, folder, shard, c, allow_index=False)
        if sub is None:
            continue
        c.files.extend(sub.files)
        c.pickles.extend(sub.pickles)
        c.problems.extend(sub.problems)
        if isinstance(sub.root, dict):
            merged.update(sub.root)
    listed = set(wm)
    if len(shards) > MAX_FILES:
        c.problems.append({"what": "index", "reason": f"{len(shards)} shard files listed; only the first "
                                                      f"{MAX_FILES} were read"})
    failed = {p["what"] for p in c.problems}
    missing = [k for k in wm if k not in merged and str(wm[k]) not in failed]
    if missing:
        c.problems.append({"what": "index", "reason": f"{len(missing)} keys of the weight_map are in no shard "
                                                      f"(first: {missing[0]})"})
    extra = [k for k in merged if k not in listed]
    if extra:
        c.notes.append(f"{len(extra)} tensors in the shards are not listed in the index (first: {extra[0]})")
    c.root = merged


def load_json(path: str) -> object:
    size = os.path.getsize(path)
    if size > MAX_JSON:
        raise Unreadable("oversized JSON", f"{size} bytes, above the {MAX_JSON >> 20} MiB limit for an index", path)
    try:
        with open_regular(path) as f:
            return json.loads(f.read(MAX_JSON).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Unreadable("not a checkpoint", f"JSON file that does not parse ({type(e).__name__}: "
                         f"{brief(str(e), 160)})", path) from None


def read_part(full: str, folder: str, name: str, c: Contents, allow_index: bool = False) -> Contents | None:
    """Read one file of a multi-file checkpoint; a failure becomes a problem of ``c`` (not an exception).

    The pickles a failing part had already scanned are kept in ``c`` (judged for safety).
    """
    why = not_regular(full, folder)
    if why is not None:
        c.problems.append({"what": name, "reason": why})
        return None
    try:
        return read_file(full, allow_index=allow_index)
    except Unreadable as e:
        c.problems.append({"what": name, "reason": f"{e.what}: {e.detail}"})
        c.pickles.extend(e.pickles)
    except OSError as e:
        c.problems.append({"what": name, "reason": f"cannot read: {e.strerror or type(e).__name__}"})
    return None
