"""Read checkpoint folders: a folder with a Hugging Face ``*.index.json`` of shards, a DCP folder,
a Trainer/accelerate folder read as one checkpoint, or a folder holding exactly one checkpoint file.

Each file of a folder is read by :func:`torchdoctor.checkpoint.detect.read_file` (its bytes decide its
format); a part that cannot be read is noted as a problem of the whole (``Contents.problems``).
"""

from __future__ import annotations

import os
from collections import OrderedDict

from torchdoctor.checkpoint.detect import load_json, read_file, read_index, read_part
from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import not_regular
from torchdoctor.checkpoint.limits import CKPT_EXT, HF_WEIGHTS, MAX_FILES, TRAINER_FILES
from torchdoctor.checkpoint.values import Contents
from torchdoctor.errors import DoctorError
from torchdoctor.safe import visible


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
        sub = read_part(os.path.join(path, n), path, n, c)
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
                c.root[n] = load_json(full)
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
