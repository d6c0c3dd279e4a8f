"""Reader of the legacy ``torch.save`` format (``_use_new_zipfile_serialization=False``).

Layout: five pickles back to back — magic number, protocol version, sys_info, the object
tree (storages as persistent ids), the sorted list of storage keys — then, for each key
in that order, an int64 element count (little-endian) and the raw storage bytes.
"""

from __future__ import annotations

import mmap
import os
import struct

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.checkpoint.fsutil import open_regular
from torchdoctor.checkpoint.pickle_scan import PickleScanError, scan_pickle
from torchdoctor.checkpoint.stub_unpickler import StorageRef, storage_ref, stub_load
from torchdoctor.checkpoint.torch_zip import ZipRead
from torchdoctor.checkpoint.values import ITEMSIZE, Storage, brief

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


def looks_legacy(head: bytes) -> bool:
    """A pickle (PROTO opcode) whose first value is the torch magic number (LONG1, 10 bytes)."""
    return len(head) >= 14 and head[0] == 0x80 and head[2] == 0x8A and \
        int.from_bytes(head[4:14], "little") == MAGIC_NUMBER


def read_torch_legacy(path: str) -> ZipRead:
    from torchdoctor.checkpoint.limits import MAX_PICKLE

    size = os.path.getsize(path)
    with open_regular(path) as f:
        try:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:  # only the pickles' pages are touched
                end = 0
                for i in range(3):
                    _info, end = scan_pickle(m, f"{path}#header{i}", end, max_bytes=1 << 16)
                main_start = end
                main_info, main_end = scan_pickle(m, path, main_start, max_bytes=MAX_PICKLE)
                keys_info, data_start = scan_pickle(m, f"{path}#keys", main_end, max_bytes=MAX_PICKLE)
        except PickleScanError as e:
            short = "not enough data" in str(e) or "STOP" in str(e)
            raise Unreadable("truncated legacy checkpoint" if short else "corrupt legacy checkpoint",
                             f"pickle stream broken: {e}", path,
                             pickles=[e.partial] if e.partial else []) from None
        f.seek(0)
        try:
            magic = stub_load(f)
            proto = stub_load(f)
            stub_load(f)  # sys_info: {protocol_version, little_endian, type_sizes}
        except Exception as e:  # noqa: BLE001
            raise Unreadable("corrupt legacy checkpoint", f"header: {type(e).__name__}: {brief(str(e), 200)}",
                             path) from None
        if magic != MAGIC_NUMBER or proto != PROTOCOL_VERSION:
            raise Unreadable("not a torch checkpoint", f"magic {magic!r}, protocol {proto!r}", path)
        refs: dict[str, StorageRef] = {}

        def on_storage(pid: tuple) -> StorageRef:
            ref = storage_ref(pid)
            if len(pid) > 5 and pid[5] is not None:
                ref.key = f"{ref.key}/view"  # legacy storage views: located but not scanned
            return refs.setdefault(ref.key, ref)

        f.seek(main_start)
        try:
            root = stub_load(f, on_storage)
            f.seek(main_end)
            keys = stub_load(f)
        except Exception as e:  # noqa: BLE001
            raise Unreadable("corrupt legacy checkpoint", f"{type(e).__name__}: {brief(str(e), 200)}", path,
                             pickles=[main_info]) from None
    out = ZipRead(root=root, pickle=main_info)
    out.pickle.unsupported_ops = sorted(set(main_info.unsupported_ops) | set(keys_info.unsupported_ops))
    pos = data_start
    with open_regular(path) as f:
        for key in keys if isinstance(keys, list) else []:
            key = key if isinstance(key, str) else brief(key, 60)
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                raise Unreadable("truncated legacy checkpoint",
                                 f"storage {key} starts at byte {pos} but the file has {size}", path)
            (numel,) = struct.unpack("<q", head)
            if numel < 0:
                raise Unreadable("corrupt legacy checkpoint", f"storage {key}: negative element count {numel}", path,
                                 pickles=[out.pickle])
            ref = refs.get(key)
            itemsize = ITEMSIZE.get(ref.dtype, 1) if ref else 1
            nbytes = int(numel * itemsize)
            if pos + 8 + nbytes > size:
                raise Unreadable("truncated legacy checkpoint",
                                 f"storage {key} needs bytes up to {pos + 8 + nbytes} but the file has {size}", path,
                                 pickles=[out.pickle])
            if ref is not None:
                ref.resolved = Storage(path, pos + 8, nbytes, key=f"{path}:{key}", dtype=ref.dtype)
                out.storages[key] = ref.resolved
            pos += 8 + nbytes
    return out
