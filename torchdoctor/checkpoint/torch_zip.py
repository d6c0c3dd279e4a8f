"""Reader of the ``torch.save`` zip format (default since PyTorch 1.6).

Layout: ``<archive>/data.pkl`` (the pickled object tree, tensors as persistent ids
``('storage', StorageType, key, location, numel)``), ``<archive>/data/<key>`` (raw
storage bytes, stored uncompressed and 64-byte aligned), ``<archive>/byteorder``,
``<archive>/version``. Only ``data.pkl`` is read into memory; storages are located by
their absolute file offset so the NaN/Inf scan can stream them later.
"""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fileview import open_window
from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
from torchdoctor.checkpoint.stub_unpickler import StorageRef, storage_ref, stub_load
from torchdoctor.checkpoint.values import PickleInfo, Storage

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header, 30 bytes
_MAX_PICKLE = 1 << 31


@dataclass
class ZipRead:
    root: Any
    pickle: PickleInfo
    storages: dict[str, Storage] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    archive: str = ""


def _data_offset(f, zi: zipfile.ZipInfo) -> int:
    """Offset of a member's bytes inside the (windowed) file, from its local header."""
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
    """Read the zip archive found at ``[base, base+length)`` of ``path`` (whole file by default)."""
    label = label or path
    with open_window(path, base, length) as f:
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile as e:
            raise Unreadable("truncated or corrupt zip",
                             f"{e}: the zip's central directory is missing or damaged "
                             "(an interrupted save or copy cuts it off)", path) from None
        with zf:
            infos = {zi.filename: zi for zi in zf.infolist()}
            pkl_name = _find_pickle(list(infos))
            prefix = pkl_name[: -len("data.pkl")]
            zi = infos[pkl_name]
            if zi.file_size > _MAX_PICKLE:
                raise Unreadable("oversized pickle", f"{pkl_name} is {zi.file_size} bytes", path)
            try:
                data = zf.read(pkl_name)
                byteorder = zf.read(prefix + "byteorder").decode("ascii", "replace").strip() \
                    if prefix + "byteorder" in infos else "little"
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise Unreadable("corrupt zip", f"cannot read {pkl_name}: {e}", path) from None
            try:
                pinfo, _ = scan_pickle(data, f"{label}:{pkl_name}")
            except PickleScanError as e:
                raise Unreadable("corrupt pickle", f"{pkl_name}: {e}", path) from None
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
                    st = Storage(path, base + _data_offset(f, rec), rec.file_size,
                                 key=f"{label}:{ref.key}", dtype=ref.dtype, byteorder=byteorder)
                    ref.resolved = st
                    out.storages[ref.key] = st
                return ref

            try:
                out.root = stub_load(data, on_storage)
            except Unreadable:
                raise
            except Exception as e:  # noqa: BLE001 - any malformed pickle is unreadable input
                names = ", ".join(pinfo.globals[:6]) or "none"
                raise Unreadable("corrupt pickle", f"{pkl_name}: {type(e).__name__}: {e} (globals it names: {names})",
                                 path, pickles=[pinfo]) from None
            return out
