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
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
from torchdoctor.checkpoint.stub_unpickler import DType, stub_load
from torchdoctor.checkpoint.torch_zip import read_torch_zip
from torchdoctor.checkpoint.values import ITEMSIZE, Contents, Opaque, Storage, TensorInfo

# Globals DCP's own writer puts in .metadata and in its byte items: expected, not alarming.
DCP_EXPECTED_PREFIXES = ("torch.distributed.checkpoint.", "pathlib.")


def metadata_file(path: str) -> str | None:
    """The DCP metadata file of directory ``path`` (global, else the first rank-local one)."""
    p = os.path.join(path, ".metadata")
    if os.path.isfile(p):
        return p
    ranked = sorted(n for n in os.listdir(path) if n.startswith("__") and n.endswith(".metadata"))
    return os.path.join(path, ranked[0]) if ranked else None


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    return obj.attrs.get(name, default) if isinstance(obj, Opaque) else default


def read_dcp(path: str, contents: Contents) -> Any:
    """Fill ``contents`` (files, pickles, problems) and return the reconstructed state dict."""
    mpath = metadata_file(path)
    if mpath is None:
        raise Unreadable("not a DCP checkpoint", "no .metadata file", path)
    with open(mpath, "rb") as f:
        raw = f.read()
    try:
        pinfo, _ = scan_pickle(raw, mpath)
    except PickleScanError as e:
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)}: {e}", mpath) from None
    try:
        md = stub_load(raw)
    except Exception as e:  # noqa: BLE001
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)}: {type(e).__name__}: {e}", mpath,
                         pickles=[pinfo]) from None
    contents.pickles.append(pinfo)
    sd_meta = _attr(md, "state_dict_metadata")
    if not isinstance(md, Opaque) or not md.cls.endswith("Metadata") or not isinstance(sd_meta, dict):
        raise Unreadable("corrupt DCP metadata", f"{os.path.basename(mpath)} holds a "
                         f"{md.cls if isinstance(md, Opaque) else type(md).__name__}, not a DCP Metadata",
                         mpath, pickles=[pinfo])
    planner = _attr(md, "planner_data") or {}
    where: dict[str, list] = {}
    for idx, sinfo in (_attr(md, "storage_data") or {}).items():
        fqn = _attr(idx, "fqn")
        if isinstance(fqn, str):
            where.setdefault(fqn, []).append(sinfo)
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            contents.files.append({"path": full, "bytes": os.path.getsize(full), "format": "dcp"})
    flat: dict[str, Any] = {}
    for fqn, item in sd_meta.items():
        flat[fqn] = _read_item(path, fqn, item, where.get(fqn, []), contents)
    return _nest(flat, planner)


def _read_item(root: str, fqn: str, item: Any, sinfos: list, contents: Contents) -> Any:
    is_tensor = isinstance(item, Opaque) and item.cls.endswith("TensorStorageMetadata")
    if is_tensor:
        props = _attr(item, "properties")
        pstate = props.state if isinstance(props, Opaque) else None
        dtype = str(pstate[0]) if isinstance(pstate, tuple) and pstate and isinstance(pstate[0], DType) \
            else str(_attr(props, "dtype", "?"))
        size = _attr(item, "size", ())
        t = TensorInfo(dtype=dtype, shape=tuple(size) if isinstance(size, tuple) else ())
        for s in sinfos:
            st = _locate(root, fqn, s, contents, tensor_dtype=dtype)
            if isinstance(st, Storage):
                t.parts.append(st)
        return t
    values = [_locate(root, fqn, s, contents) for s in sinfos[:1]]
    return values[0] if values else None


def _locate(root: str, fqn: str, sinfo: Any, contents: Contents, tensor_dtype: str | None = None) -> Any:
    rel, off, length = _attr(sinfo, "relative_path"), _attr(sinfo, "offset"), _attr(sinfo, "length")
    if not isinstance(rel, str) or not isinstance(off, int) or not isinstance(length, int):
        contents.problems.append({"what": fqn, "reason": "storage entry without file/offset/length"})
        return None
    fpath = os.path.join(root, rel)
    if os.path.dirname(os.path.normpath(fpath)) != os.path.normpath(root):
        contents.problems.append({"what": fqn, "reason": f"storage path {rel!r} leaves the checkpoint folder"})
        return None
    if not os.path.isfile(fpath):
        contents.problems.append({"what": fqn, "reason": f"data file {rel} is missing"})
        return None
    if _attr(sinfo, "transform_descriptors"):
        contents.notes.append(f"{fqn}: stored with transforms {_attr(sinfo, 'transform_descriptors')}; not scanned")
        return None
    if off + length > os.path.getsize(fpath):
        contents.problems.append({"what": fqn, "reason": f"{rel} is shorter than its index says (truncated)"})
        return None
    with open(fpath, "rb") as f:
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
        return None
    if tensor_dtype is not None:
        st = z.root.data() if isinstance(z.root, TensorInfo) else []
        return st[0] if st else None
    if z.pickle.globals:
        contents.pickles.append(z.pickle)
    return z.root


def _nest(flat: dict[str, Any], planner: dict) -> dict:
    """Rebuild the nested state dict from flattened keys and their original key paths."""
    out: dict = {}
    for fqn, value in flat.items():
        path = planner.get(fqn)
        if not isinstance(path, tuple) or not path:
            path = (fqn,)
        node = out
        for k in path[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict):
                nxt = {}
                node[k] = nxt
            node = nxt
        node[path[-1]] = value
    return _lists(out)


def _lists(node: Any) -> Any:
    """Containers whose keys are exactly 0..n-1 came from lists (e.g. param_groups)."""
    if not isinstance(node, dict):
        return node
    for k in list(node):
        node[k] = _lists(node[k])
    keys = list(node)
    if keys and all(type(k) is int for k in keys) and sorted(keys) == list(range(len(keys))):
        return [node[i] for i in range(len(keys))]
    return node
