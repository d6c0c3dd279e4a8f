"""Reader of the ``torch.save`` zip format (default since PyTorch 1.6).

Layout: ``<archive>/data.pkl`` (the pickled object tree, tensors as persistent ids
``('storage', StorageType, key, location, numel)``), ``<archive>/data/<key>`` (raw
storage bytes, stored uncompressed and 64-byte aligned), ``<archive>/byteorder``,
``<archive>/version``. Only ``data.pkl`` is read into memory; storages are located by
their absolute file offset so the NaN/Inf scan can stream them later.
"""

from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fileview import open_window
from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
from torchdoctor.checkpoint.stub_unpickler import StorageRef, storage_ref, stub_load
from torchdoctor.checkpoint.values import PickleInfo, Storage, brief

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header, 30 bytes


@dataclass
class ZipRead:
    root: Any
    pickle: PickleInfo
    storages: dict[str, Storage] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    archive: str = ""


def _data_offset(f, zi: zipfile.ZipInfo) -> int:
    """Offset of a member's bytes inside the (windowed) file, from its local header."""
    if zi.header_offset < 0:
        raise Unreadable("corrupt zip", f"negative local header offset for {zi.filename}")
    f.seek(zi.header_offset)
    hdr = f.read(30)
    if len(hdr) != 30 or hdr[:4] != b"PK\x03\x04":
        raise Unreadable("corrupt zip", f"bad local header for {zi.filename}")
    fields = _LOCAL_HEADER.unpack(hdr)
    name_len, extra_len = fields[-2], fields[-1]
    return zi.header_offset + 30 + name_len + extra_len


def _find_pickle(names: list[str]) -> str:
    pkls = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
    if not pkls:
        if any(n.endswith("constants.pkl") for n in names) or any("/code/" in n for n in names):
            raise Unreadable("TorchScript archive",
                             "a torch.jit.save archive (code/, constants.pkl), not a torch.save checkpoint; "
                             "load it with torch.jit.load")
        shown = ", ".join(names[:5]) + (" …" if len(names) > 5 else "")
        raise Unreadable("zip without data.pkl", f"a zip archive that torch.save did not write (holds: {shown})")
    return pkls[0]


def read_torch_zip(path: str, base: int = 0, length: int | None = None, label: str | None = None) -> ZipRead:
    """Read the zip archive found at ``[base, base+length)`` of ``path`` (whole file by default).

    Bounded by construction: ``data.pkl`` must be stored (torch never compresses it: a deflated
    one is refused, so a decompression bomb is never inflated), at most ``MAX_PICKLE`` bytes and
    inside the file; a storage record whose claimed size runs past the end of the file is
    reported and never scanned.
    """
    from torchdoctor.checkpoint.limits import MAX_PICKLE

    label = label or path
    size = os.path.getsize(path)
    limit = max(0, size - base) if length is None else max(0, min(length, size - base))
    with open_window(path, base, length) as f:
        try:
            zf = zipfile.ZipFile(f)
        except Exception as e:  # noqa: BLE001 - BadZipFile, and whatever a crafted directory provokes
            raise Unreadable("truncated or corrupt zip",
                             f"{type(e).__name__}: {brief(str(e), 200)}: the zip's central directory is missing "
                             "or damaged (an interrupted save or copy cuts it off)", path) from None
        with zf:
            try:
                infos = {zi.filename: zi for zi in zf.infolist()}
            except Exception as e:  # noqa: BLE001
                raise Unreadable("corrupt zip", f"{type(e).__name__}: {brief(str(e), 200)}", path) from None
            pkl_name = _find_pickle(list(infos))
            prefix = pkl_name[: -len("data.pkl")]
            zi = infos[pkl_name]
            if zi.compress_type != zipfile.ZIP_STORED:
                raise Unreadable("compressed data.pkl",
                                 f"{pkl_name} is compressed (method {zi.compress_type}); torch.save never compresses "
                                 "it, so it is refused unread (a compressed pickle can inflate to gigabytes)", path)
            if zi.file_size > MAX_PICKLE or zi.file_size > limit:
                raise Unreadable("oversized pickle", f"{pkl_name} claims {zi.file_size} bytes (limit "
                                 f"{MAX_PICKLE >> 20} MiB, file {limit} bytes)", path)
            try:
                data = zf.read(pkl_name)
                bo = infos.get(prefix + "byteorder")
                byteorder = zf.read(bo.filename).decode("ascii", "replace").strip() \
                    if bo is not None and bo.file_size <= 16 and bo.compress_type == zipfile.ZIP_STORED else "little"
            except Exception as e:  # noqa: BLE001 - CRC errors, short reads, crafted headers
                raise Unreadable("corrupt zip", f"cannot read {pkl_name}: {type(e).__name__}: "
                                 f"{brief(str(e), 200)}", path) from None
            try:
                pinfo, _ = scan_pickle(data, f"{label}:{pkl_name}")
            except PickleScanError as e:
                raise Unreadable("corrupt pickle", f"{pkl_name}: {e}", path,
                                 pickles=[e.partial] if e.partial else []) from None
            out = ZipRead(root=None, pickle=pinfo, archive=prefix.rstrip("/"))
            cache: dict[str, StorageRef] = {}

            def on_storage(pid: tuple) -> StorageRef:
                ref = storage_ref(pid)
                if ref.key in cache:
                    return cache[ref.key]
                cache[ref.key] = ref
                rec = infos.get(f"{prefix}data/{ref.key}")
                if rec is None:
                    out.problems.append(f"storage {ref.key}: record {prefix}data/{ref.key} missing")
                elif rec.compress_type != zipfile.ZIP_STORED:
                    out.problems.append(f"storage {ref.key}: compressed record, not scanned")
                else:
                    off = _data_offset(f, rec)
                    if off + rec.file_size > limit:
                        out.problems.append(f"storage {ref.key}: record claims {rec.file_size} bytes at offset {off}, "
                                            f"past the end of the file ({limit} bytes); not scanned")
                        return ref
                    st = Storage(path, base + off, rec.file_size,
                                 key=f"{label}:{ref.key}", dtype=ref.dtype, byteorder=byteorder)
                    ref.resolved = st
                    out.storages[ref.key] = st
                return ref

            try:
                out.root = stub_load(data, on_storage)
            except Unreadable as e:
                e.pickles = e.pickles or [pinfo]
                raise
            except Exception as e:  # noqa: BLE001 - any malformed pickle is unreadable input
                names = ", ".join(pinfo.globals[:6]) or "none"
                raise Unreadable("corrupt pickle", f"{pkl_name}: {type(e).__name__}: {brief(str(e), 200)} "
                                 f"(globals it names: {names})", path, pickles=[pinfo]) from None
            return out
