"""Open a checkpoint path: sniff its format from its bytes and hand it to the right reader.

Files: torch.save zip, legacy torch.save, safetensors, a plain pickle, a Hugging Face
``*.index.json`` of shards. Directories: DCP (``.metadata``), a folder with an index of
shards, a Hugging Face Trainer ``checkpoint-N/`` folder (model + optimizer.pt +
scheduler.pt + rng_state.pth + trainer_state.json …) read as one checkpoint, or a folder
holding exactly one checkpoint file. The file extension is never trusted over the bytes.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.values import Contents
from torchdoctor.errors import DoctorError

CKPT_EXT = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar", ".pkl", ".pickle", ".model")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
TRAINER_FILES = ("optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "trainer_state.json",
                 "training_args.bin", "rng_state.pth", "random_states_0.pkl")
_MAGIC = [
    (b"GGUF", "GGUF file (llama.cpp), not a PyTorch checkpoint"),
    (b"\x89HDF\r\n\x1a\n", "HDF5 file (Keras/h5py), not a PyTorch checkpoint"),
    (b"\x93NUMPY", "numpy .npy array, not a PyTorch checkpoint"),
    (b"\x1f\x8b", "gzip-compressed data: decompress it first"),
    (b"version https://git-lfs", "a Git LFS pointer file: the real checkpoint was never downloaded (git lfs pull)"),
]


def check_path(path: str) -> None:
    """Usage errors (exit 2): the path is missing or cannot be opened at all."""
    if not os.path.lexists(path):
        raise DoctorError(f"ckpt-unreadable: no such file or directory: {path}",
                          hint="check the path; a checkpoint is a file or a DCP/Hugging Face folder")
    if not os.path.exists(path):
        raise DoctorError(f"ckpt-unreadable: broken symbolic link: {path}")
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except PermissionError:
        raise DoctorError(f"ckpt-unreadable: permission denied: {path}",
                          hint="run as a user who may read it, or copy it somewhere readable") from None
    except IsADirectoryError:
        pass
    except OSError as e:
        raise DoctorError(f"ckpt-unreadable: cannot open {path}: {e.strerror or e}") from None


def read(path: str) -> Contents:
    """Read ``path`` into :class:`Contents`; raises :class:`Unreadable` or DoctorError."""
    check_path(path)
    if os.path.isdir(path):
        return _read_dir(path)
    _prefetch(path)
    return _read_file(path)


def _prefetch(path: str) -> None:
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
    size = os.path.getsize(path)
    with open(path, "rb") as f:
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
    if size <= _MAX_PLAIN_PICKLE and _parses_as_pickle(path, size):
        return "pickle", head, size  # protocol 0/1 pickles have no PROTO opcode to sniff
    return "unknown", head, size


_MAX_PLAIN_PICKLE = 64 << 20


def _parses_as_pickle(path: str, size: int) -> bool:
    from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle

    with open(path, "rb") as f:
        raw = f.read()
    try:
        info, end = scan_pickle(raw, path)
    except PickleScanError:
        return False
    return end >= size - 2


def _is_tar(path: str) -> bool:
    with open(path, "rb") as f:
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


def _read_file(path: str) -> Contents:
    fmt, head, size = _sniff(path)
    c = Contents(path=path, format=fmt, files=[{"path": path, "bytes": size, "format": fmt}])
    if fmt in ("torch-zip", "torch-legacy", "pickle"):
        c.root = _read_pickled(path, fmt, c)
    elif fmt == "safetensors":
        from torchdoctor.checkpoint.safetensors import read_safetensors

        c.root, c.metadata = read_safetensors(path)
    elif fmt == "json":
        _read_index(path, c)
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

    with open(path, "rb") as f:
        raw = f.read()
    try:
        info, _ = scan_pickle(raw, path)
        root = stub_load(raw)
    except (PickleScanError, Exception) as e:  # noqa: BLE001
        raise Unreadable("corrupt pickle", f"{type(e).__name__}: {e}", path) from None
    info.unsupported_ops = info.unsupported_ops or ["(not written by torch.save)"]
    return ZipRead(root=root, pickle=info)


def _read_index(path: str, c: Contents) -> None:
    """A Hugging Face ``*.index.json``: ``{"metadata": {...}, "weight_map": {key: shard file}}``."""
    try:
        with open(path, encoding="utf-8") as f:
            idx = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Unreadable("not a checkpoint", f"JSON file that does not parse ({e})", path) from None
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise Unreadable("not a checkpoint", "JSON file without a weight_map (not a shard index)", path)
    c.format = "hf-index"
    c.metadata = idx.get("metadata") if isinstance(idx.get("metadata"), dict) else {}
    folder = os.path.dirname(os.path.abspath(path))
    merged: OrderedDict = OrderedDict()
    shards = list(OrderedDict.fromkeys(str(v) for v in wm.values()))
    for shard in shards:
        spath = os.path.join(folder, shard)
        if os.path.dirname(os.path.normpath(spath)) != os.path.normpath(folder):
            c.problems.append({"what": shard, "reason": "shard path leaves the index's folder"})
            continue
        if not os.path.isfile(spath):
            c.problems.append({"what": shard, "reason": "shard listed in the index is missing"})
            continue
        try:
            sub = _read_file(spath)
        except Unreadable as e:
            c.problems.append({"what": shard, "reason": f"{e.what}: {e.detail}"})
            continue
        except PermissionError:
            c.problems.append({"what": shard, "reason": "permission denied"})
            continue
        c.files.extend(sub.files)
        c.pickles.extend(sub.pickles)
        c.problems.extend(sub.problems)
        if isinstance(sub.root, dict):
            merged.update(sub.root)
    listed = set(wm)
    missing = [k for k in wm if k not in merged and not any(p["what"] == wm[k] for p in c.problems)]
    if missing:
        c.problems.append({"what": "index", "reason": f"{len(missing)} keys of the weight_map are in no shard "
                                                      f"(first: {missing[0]})"})
    extra = [k for k in merged if k not in listed]
    if extra:
        c.notes.append(f"{len(extra)} tensors in the shards are not listed in the index (first: {extra[0]})")
    c.root = merged


def _read_dir(path: str) -> Contents:
    from torchdoctor.checkpoint.dcp import metadata_file, read_dcp

    names = sorted(os.listdir(path))
    if metadata_file(path) is not None:
        c = Contents(path=path, format="dcp")
        c.root = read_dcp(path, c)
        return c
    indexes = [n for n in names if n.endswith(".index.json")]
    ckpts = [n for n in names if n.endswith(CKPT_EXT) and os.path.isfile(os.path.join(path, n))]
    trainer = [n for n in names if n in TRAINER_FILES or n.startswith("rng_state")]
    if not indexes and not ckpts:
        shown = ", ".join(names[:8]) + (f" … ({len(names)} entries)" if len(names) > 8 else "")
        raise Unreadable("no checkpoint in directory",
                         "no .metadata (DCP), no *.index.json, no .pt/.pth/.bin/.ckpt/.safetensors file; "
                         f"it holds: {shown or 'nothing'}", path)
    same_weights = [n for n in HF_WEIGHTS if n in ckpts]
    if not indexes and not trainer and same_weights and len(same_weights) == len(ckpts):
        ckpts = same_weights[:1]  # a Hub folder with the same weights as .safetensors and .bin: read the first
    if not indexes and not trainer and len(ckpts) == 1:
        c = _read_file(os.path.join(path, ckpts[0]))
        c.notes.append(f"the folder holds one checkpoint: {ckpts[0]}"
                       + (f" (also as {', '.join(same_weights[1:])}, not read)" if len(same_weights) > 1 else ""))
        return c
    if not indexes and not trainer:
        raise DoctorError(f"{path} holds {len(ckpts)} checkpoint files ({', '.join(ckpts[:4])}"
                          f"{' …' if len(ckpts) > 4 else ''}): pass one of them")
    return _read_composite(path, names, indexes, ckpts)


def _read_composite(path: str, names: list[str], indexes: list[str], ckpts: list[str]) -> Contents:
    """A folder whose files together form one checkpoint (Hugging Face Trainer layout)."""
    c = Contents(path=path, format="directory", root=OrderedDict())
    index = sorted(indexes, key=lambda n: (not n.endswith("safetensors.index.json"), n))[:1]
    sharded: set[str] = set()
    for n in index:
        sub = Contents(path=os.path.join(path, n), format="hf-index")
        try:
            _read_index(os.path.join(path, n), sub)
        except Unreadable as e:
            c.problems.append({"what": n, "reason": f"{e.what}: {e.detail}"})
            continue
        _absorb(c, sub)
        c.root[n] = sub.root
        sharded |= {os.path.basename(f["path"]) for f in sub.files}
    others = [n for n in ckpts if n not in sharded]
    if index:  # shards of other indexes (e.g. both .bin and .safetensors copies) are duplicates
        others = [n for n in others if not _is_shard_name(n)]
    for n in others:
        full = os.path.join(path, n)
        try:
            sub = _read_file(full)
        except Unreadable as e:
            c.problems.append({"what": n, "reason": f"{e.what}: {e.detail}"})
            continue
        except PermissionError:
            c.problems.append({"what": n, "reason": "permission denied"})
            continue
        _absorb(c, sub)
        c.root[n] = sub.root
    for n in names:
        if n == "trainer_state.json":
            full = os.path.join(path, n)
            try:
                with open(full, encoding="utf-8") as f:
                    c.root[n] = json.load(f)
                c.files.append({"path": full, "bytes": os.path.getsize(full), "format": "json"})
            except (OSError, ValueError) as e:
                c.problems.append({"what": n, "reason": f"cannot parse: {e}"})
    return c


def _is_shard_name(n: str) -> bool:
    import re

    return re.search(r"-\d{5}-of-\d{5}\.", n) is not None


def _absorb(c: Contents, sub: Contents) -> None:
    c.files.extend(sub.files)
    c.pickles.extend(sub.pickles)
    c.problems.extend(sub.problems)
    c.notes.extend(sub.notes)
    if sub.metadata:
        c.metadata[os.path.basename(sub.path)] = sub.metadata
