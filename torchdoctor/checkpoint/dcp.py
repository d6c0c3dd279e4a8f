"""Reader of ``torch.distributed.checkpoint`` (DCP) directories.

``.metadata`` is a pickle (DCP itself loads it with plain ``pickle.load``) of
``Metadata(state_dict_metadata={fqn: TensorStorageMetadata | BytesStorageMetadata},
planner_data={fqn: original key path}, storage_data={MetadataIndex: _StorageInfo})``;
each ``_StorageInfo(relative_path, offset, length)`` points into a ``*.distcp`` file at
a whole ``torch.save`` archive (one tensor chunk, or one pickled non-tensor value).
Everything is read with the stub unpickler: no class named in these pickles is imported.
"""

from __future__ import annotations

import os
import re
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import not_regular, open_regular
from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
from torchdoctor.checkpoint.stub_unpickler import DType, _as_tuple, stub_load
from torchdoctor.checkpoint.torch_zip import read_torch_zip
from torchdoctor.checkpoint.values import ITEMSIZE, Contents, Opaque, Storage, TensorInfo, Unread, brief

# Globals DCP's own writer puts in .metadata and in its byte items: expected, not alarming.
DCP_EXPECTED_PREFIXES = ("torch.distributed.checkpoint.", "pathlib.")


def metadata_file(path: str) -> str | None:
    """The DCP metadata file of directory ``path`` (global, else the first rank-local one)."""
    p = os.path.join(path, ".metadata")
    if os.path.lexists(p):
        return p
    ranked = sorted(n for n in os.listdir(path) if n.startswith("__") and n.endswith(".metadata"))
    return os.path.join(path, ranked[0]) if ranked else None


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    return obj.attrs.get(name, default) if isinstance(obj, Opaque) else default


def read_dcp(path: str, contents: Contents) -> Any:
    """Fill ``contents`` (files, pickles, problems) and return the reconstructed state dict."""
    from torchdoctor.checkpoint.limits import MAX_PICKLE

    mpath = metadata_file(path)
    if mpath is None:
        raise Unreadable("not a DCP checkpoint", "no .metadata file", path)
    why = not_regular(mpath, path)
    if why is not None:
        raise Unreadable("unreadable DCP metadata", f"{os.path.basename(mpath)}: {why}", mpath)
    if os.path.getsize(mpath) > MAX_PICKLE:
        raise Unreadable("oversized DCP metadata", f"{os.path.getsize(mpath)} bytes (limit {MAX_PICKLE >> 20} MiB)",
                         mpath)
    with open_regular(mpath) as f:
        raw = f.read(MAX_PICKLE)
    try:
        pinfo, _ = scan_pickle(raw, mpath)
    except PickleScanError as e:
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)}: {e}", mpath,
                         pickles=[e.partial] if e.partial else []) from None
    try:
        md = stub_load(raw)
    except Exception as e:  # noqa: BLE001
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)}: {type(e).__name__}: "
                         f"{brief(str(e), 200)}", mpath, pickles=[pinfo]) from None
    contents.pickles.append(pinfo)
    sd_meta = _attr(md, "state_dict_metadata")
    if not isinstance(md, Opaque) or not md.cls.endswith("Metadata") or not isinstance(sd_meta, dict):
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)} holds a "
                         f"{brief(md.cls, 80) if isinstance(md, Opaque) else type(md).__name__}, not a DCP Metadata",
                         mpath, pickles=[pinfo])
    planner = _attr(md, "planner_data")
    planner = planner if isinstance(planner, dict) else {}
    where: dict[str, list] = {}
    sdata = _attr(md, "storage_data")
    for idx, sinfo in (sdata if isinstance(sdata, dict) else {}).items():
        fqn = _attr(idx, "fqn")
        if isinstance(fqn, str):
            where.setdefault(fqn, []).append(sinfo)
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if not_regular(full, path) is None:
            contents.files.append({"path": full, "bytes": os.path.getsize(full), "format": "dcp"})
    flat: dict[str, Any] = {}
    for fqn, item in sd_meta.items():
        flat[fqn] = _read_item(path, fqn, item, where.get(fqn, []), contents)
    _writers(where, contents)
    return _nest(flat, planner)


WRITER_FILE = re.compile(r"__(\d+)_(\d+)\.distcp")  # FileSystemWriter: __{rank}_{n}.distcp


def _writers(where: dict[str, list], contents: Contents) -> None:
    """How many ranks wrote the checkpoint (from its data files' names) and, per missing data
    file, one problem naming its rank and the entries with data there (instead of one per
    entry: a sharded model has a chunk of every tensor in every rank's file)."""
    files: dict[str, list[str]] = {}
    for fqn, sinfos in where.items():
        for s in sinfos:
            rel = _attr(s, "relative_path")
            if isinstance(rel, str):
                files.setdefault(rel, []).append(fqn)
    ranks = {int(m.group(1)) for rel in files if (m := WRITER_FILE.fullmatch(rel))}
    if len(ranks) > 1:  # sharded training (FSDP, tensor parallel): one data file per rank
        contents.metadata["dcp_writer_ranks"] = len(ranks)
        contents.notes.append(
            f"written by {len(ranks)} rank{'s' if len(ranks) != 1 else ''} "
            f"({len(files)} data file{'s' if len(files) != 1 else ''}); DCP re-shards on load, so a "
            f"run with another world size can resume from it")
    missing = {f"data file {rel} is missing" for rel in files}
    kept, grouped = [], {}
    for p in contents.problems:
        if p.get("reason") in missing:
            grouped.setdefault(p["reason"], []).append(p["what"])
        else:
            kept.append(p)
    for reason, fqns in grouped.items():
        rel = reason[len("data file "):-len(" is missing")]
        m = WRITER_FILE.fullmatch(rel)
        who = f" (written by rank {m.group(1)} of {len(ranks)})" if m else ""
        kept.append({"what": rel, "reason": (
            f"data file missing{who}: {len(set(fqns))} entr{'ies' if len(set(fqns)) != 1 else 'y'} "
            f"have data there ({', '.join(sorted(set(fqns))[:3])}{', …' if len(set(fqns)) > 3 else ''})")})
    contents.problems[:] = kept


def _read_item(root: str, fqn: str, item: Any, sinfos: list, contents: Contents) -> Any:
    is_tensor = isinstance(item, Opaque) and item.cls.endswith("TensorStorageMetadata")
    if is_tensor:
        props = _attr(item, "properties")
        pstate = props.state if isinstance(props, Opaque) else None
        dtype = str(pstate[0]) if isinstance(pstate, tuple) and pstate and isinstance(pstate[0], DType) \
            else brief(_attr(props, "dtype", "?"), 40).strip("'")
        t = TensorInfo(dtype=dtype[:40], shape=_as_tuple(_attr(item, "size", ())))
        for s in sinfos:
            st = _locate(root, fqn, s, contents, tensor_dtype=dtype)
            if isinstance(st, Storage):
                t.parts.append(st)
        return t
    values = [_locate(root, fqn, s, contents) for s in sinfos[:1]]
    if values and values[0] is None and contents.problems and contents.problems[-1].get("what") == fqn:
        return Unread(contents.problems[-1]["reason"])  # saved, its data not readable
    return values[0] if values else None


def _locate(root: str, fqn: str, sinfo: Any, contents: Contents, tensor_dtype: str | None = None) -> Any:
    try:
        return _locate_checked(root, fqn, sinfo, contents, tensor_dtype)
    except OSError as e:  # one unreadable data file is a problem of that item, not of the audit
        why = e.strerror or type(e).__name__
        contents.problems.append({"what": fqn, "reason": f"cannot read its data file: {why}"})
        return None


def _locate_checked(root: str, fqn: str, sinfo: Any, contents: Contents, tensor_dtype: str | None) -> Any:
    rel, off, length = _attr(sinfo, "relative_path"), _attr(sinfo, "offset"), _attr(sinfo, "length")
    if not isinstance(rel, str) or type(off) is not int or type(length) is not int or off < 0 or length < 0:
        contents.problems.append({"what": fqn, "reason": "storage entry without a valid file/offset/length"})
        return None
    fpath = os.path.join(root, rel)
    if "\x00" in rel or os.path.dirname(os.path.normpath(fpath)) != os.path.normpath(root):
        contents.problems.append({"what": fqn, "reason": f"storage path {brief(rel, 80)} leaves the checkpoint folder"})
        return None
    if not os.path.lexists(fpath):
        contents.problems.append({"what": fqn, "reason": f"data file {rel} is missing"})
        return None
    why = not_regular(fpath, root)
    if why is not None:
        contents.problems.append({"what": fqn, "reason": f"data file {rel}: {why}"})
        return None
    if _attr(sinfo, "transform_descriptors"):
        contents.notes.append(f"{fqn}: stored with transforms {_attr(sinfo, 'transform_descriptors')}; not scanned")
        return None
    if off + length > os.path.getsize(fpath):
        contents.problems.append({"what": fqn, "reason": f"{rel} is shorter than its index says (truncated)"})
        return None
    with open_regular(fpath) as f:
        f.seek(off)
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        if tensor_dtype is not None and tensor_dtype in ITEMSIZE:  # raw tensor bytes (safetensors-style DCP)
            return Storage(fpath, off, length, key=f"{fpath}:{off}", dtype=tensor_dtype)
        contents.problems.append({"what": fqn, "reason": f"{rel}@{off}: not a torch.save record"})
        return None
    try:
        z = read_torch_zip(fpath, off, length, label=f"{rel}@{off}")
    except Unreadable as e:
        contents.problems.append({"what": fqn, "reason": f"{rel}@{off}: {e}"})
        contents.pickles.extend(e.pickles)
        return None
    if tensor_dtype is not None:
        st = z.root.data() if isinstance(z.root, TensorInfo) else []
        return st[0] if st else None
    if z.pickle.globals:
        contents.pickles.append(z.pickle)
    return z.root


MAX_PATH = 32  # key path length of a planner entry (deeper ones are kept flat)


def _nest(flat: dict[str, Any], planner: dict) -> dict:
    """Rebuild the nested state dict from flattened keys and their original key paths."""
    out: dict = {}
    made: set[int] = {id(out)}  # only the dicts built here are turned back into lists
    for fqn, value in flat.items():
        path = planner.get(fqn)
        if not isinstance(path, tuple) or not path or len(path) > MAX_PATH or \
                not all(type(k) in (str, int) for k in path):
            path = (fqn,)
        node = out
        for k in path[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict) or id(nxt) not in made:
                nxt = {}
                made.add(id(nxt))
                node[k] = nxt
            node = nxt
        node[path[-1]] = value
    return _lists(out, made)


def _lists(node: Any, made: set[int]) -> Any:
    """Containers whose keys are exactly 0..n-1 came from lists (e.g. param_groups)."""
    if not isinstance(node, dict) or id(node) not in made:
        return node
    for k in list(node):
        node[k] = _lists(node[k], made)
    keys = list(node)
    if keys and all(type(k) is int for k in keys) and sorted(keys) == list(range(len(keys))):
        return [node[i] for i in range(len(keys))]
    return node
