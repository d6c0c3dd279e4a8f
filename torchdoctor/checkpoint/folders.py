"""Read checkpoint folders and shard indexes: a Hugging Face ``*.index.json`` of shards, a DCP folder,
a Trainer/accelerate folder read as one checkpoint, or a folder holding exactly one checkpoint file.

Each file of a folder is read by :func:`torchdoctor.checkpoint.detect.read_file` (its bytes decide its
format); a part that cannot be read is noted as a problem of the whole (``Contents.problems``).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict

from torchdoctor.checkpoint.detect import CKPT_EXT, HF_WEIGHTS, MAX_JSON, TRAINER_FILES, read_file
from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import not_regular, open_regular
from torchdoctor.checkpoint.values import Contents, brief
from torchdoctor.errors import DoctorError
from torchdoctor.safe import visible


def read_index(path: str, c: Contents) -> None:
    """A Hugging Face ``*.index.json``: ``{"metadata": {...}, "weight_map": {key: shard file}}``."""
    idx = _load_json(path)
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
        sub = _read_part(spath, folder, shard, c, allow_index=False)
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


MAX_FILES = 512  # files of one folder or shards of one index that are read


def _load_json(path: str) -> object:
    size = os.path.getsize(path)
    if size > MAX_JSON:
        raise Unreadable("oversized JSON", f"{size} bytes, above the {MAX_JSON >> 20} MiB limit for an index", path)
    try:
        with open_regular(path) as f:
            return json.loads(f.read(MAX_JSON).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Unreadable("not a checkpoint", f"JSON file that does not parse ({type(e).__name__}: "
                         f"{brief(str(e), 160)})", path) from None


def _read_part(full: str, folder: str, name: str, c: Contents, allow_index: bool = False) -> Contents | None:
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


def read_dir(path: str) -> Contents:
    from torchdoctor.checkpoint.dcp import metadata_file, read_dcp

    names = sorted(os.listdir(path))
    if metadata_file(path) is not None:
        c = Contents(path=path, format="dcp")
        c.root = read_dcp(path, c)
        return c
    indexes = [n for n in names if n.endswith(".index.json")]
    # not isfile(): a FIFO named like a checkpoint must be seen (and reported), not skipped
    ckpts = [n for n in names if n.endswith(CKPT_EXT) and not os.path.isdir(os.path.join(path, n))]
    trainer = [n for n in names if n in TRAINER_FILES or n.startswith(("rng_state", "random_states_"))]
    if not indexes and not ckpts:
        shown = ", ".join(names[:8]) + (f" … ({len(names)} entries)" if len(names) > 8 else "")
        raise DoctorError(f"ckpt-unreadable: no checkpoint in directory {visible(path)}: no .metadata (DCP), "
                          "no *.index.json, no .pt/.pth/.bin/.ckpt/.safetensors file; "
                          f"it holds: {visible(shown) or 'nothing'}",
                          hint="pass the checkpoint file itself, or the folder that holds it")
    same_weights = [n for n in HF_WEIGHTS if n in ckpts]
    if not indexes and not trainer and same_weights and len(same_weights) == len(ckpts):
        ckpts = same_weights[:1]  # a Hub folder with the same weights as .safetensors and .bin: read the first
    if not indexes and not trainer and len(ckpts) == 1:
        full = os.path.join(path, ckpts[0])
        why = not_regular(full, path)
        if why is not None:
            raise Unreadable("not a regular file", f"{ckpts[0]}: {why}", full)
        c = read_file(full)
        c.notes.append(f"the folder holds one checkpoint: {ckpts[0]}"
                       + (f" (also as {', '.join(same_weights[1:])}, not read)" if len(same_weights) > 1 else ""))
        return c
    if not indexes and not trainer:
        shown = ", ".join(ckpts[:4]) + (" …" if len(ckpts) > 4 else "")
        raise DoctorError(f"{visible(path)} holds {len(ckpts)} checkpoint files ({visible(shown)}): pass one of them")
    return _read_composite(path, names, indexes, ckpts)


def _read_composite(path: str, names: list[str], indexes: list[str], ckpts: list[str]) -> Contents:
    """A folder whose files together form one checkpoint (Hugging Face Trainer / accelerate layout)."""
    c = Contents(path=path, format="directory", root=OrderedDict())
    index = sorted(indexes, key=lambda n: (not n.endswith("safetensors.index.json"), n))[:1]
    sharded: set[str] = set()
    for n in index:
        full = os.path.join(path, n)
        why = not_regular(full, path)
        if why is not None:
            c.problems.append({"what": n, "reason": why})
            continue
        sub = Contents(path=full, format="hf-index")
        try:
            read_index(full, sub)
        except Unreadable as e:
            c.problems.append({"what": n, "reason": f"{e.what}: {e.detail}"})
            continue
        _absorb(c, sub)
        c.root[n] = sub.root
        sharded |= {os.path.basename(f["path"]) for f in sub.files}
    others = [n for n in ckpts if n not in sharded]
    if index:  # shards of other indexes (e.g. both .bin and .safetensors copies) are duplicates
        others = [n for n in others if not _is_shard_name(n)]
    if len(others) > MAX_FILES:
        c.problems.append({"what": "folder", "reason": f"{len(others)} checkpoint files; only the first "
                                                       f"{MAX_FILES} were read"})
    for n in others[:MAX_FILES]:
        sub = _read_part(os.path.join(path, n), path, n, c)
        if sub is None:
            continue
        _absorb(c, sub)
        c.root[n] = sub.root
    if "trainer_state.json" in names:
        n = "trainer_state.json"
        full = os.path.join(path, n)
        why = not_regular(full, path)
        if why is not None:
            c.problems.append({"what": n, "reason": why})
        else:
            try:
                c.root[n] = _load_json(full)
                c.files.append({"path": full, "bytes": os.path.getsize(full), "format": "json"})
            except Unreadable as e:
                c.problems.append({"what": n, "reason": f"cannot parse: {e.detail}"})
            except OSError as e:
                c.problems.append({"what": n, "reason": f"cannot read: {e.strerror or type(e).__name__}"})
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
