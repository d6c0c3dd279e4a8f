"""The contents tree for the report: per top-level entry, its role, tensors, dtypes, devices, bytes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torchdoctor.checkpoint.roles import Roles
from torchdoctor.checkpoint.scan import ScanResult
from torchdoctor.checkpoint.values import Contents, TensorInfo, brief, plain
from torchdoctor.checkpoint.walk import children, iter_tensors, kind_of

MAX_ENTRIES = 40


def _tensor_stats(obj: Any) -> dict:
    n, nbytes = 0, 0
    dtypes: Counter = Counter()
    devices: Counter = Counter()
    seen: set = set()
    for _p, t in iter_tensors(obj):
        n += 1
        dtypes[t.dtype] += t.nbytes
        devices[t.device] += 1
        st = t.data()
        ident = tuple(s.key for s in st) if st else id(t)
        if ident not in seen:  # tensors sharing a storage count its bytes once
            seen.add(ident)
            nbytes += t.nbytes
    return {"tensors": n, "bytes": nbytes, "dtypes": dict(dtypes.most_common()), "devices": dict(devices)}


def _role(path: str, roles: Roles) -> str:
    if path in roles.role_of:
        return roles.role_of[path]
    inner_roles = [r for p, r in roles.role_of.items() if p.startswith(path + ".")]
    if inner_roles and all(r.startswith("rng (") for r in inner_roles):
        return "rng (" + ", ".join(r[5:-1] for r in inner_roles) + ")"
    inner = sorted({r.split(" ")[0] for r in inner_roles})
    return ("holds " + ", ".join(inner)) if inner else ""


def entries(root: Any, roles: Roles) -> list[dict]:
    """One row per top-level entry (or one row for a bare state_dict)."""
    if "" in roles.role_of or isinstance(root, TensorInfo):
        row = {"key": "<root>", "role": roles.role_of.get("", "tensor"), "type": kind_of(root)}
        row.update(_tensor_stats(root))
        if isinstance(root, dict):
            row["keys"] = len(root)
        return [row]
    rows = []
    for k, v in children(root):
        row = {"key": k, "role": _role(k, roles), "type": kind_of(v)}
        if isinstance(v, (bool, int, float, str)) or v is None:
            row["value"] = plain(v, 60)
        row.update(_tensor_stats(v))
        rows.append(row)
        if len(rows) >= MAX_ENTRIES:
            rows.append({"key": "…", "role": "", "type": f"{sum(1 for _ in children(root)) - MAX_ENTRIES} more"})
            break
    return rows


def build(contents: Contents, roles: Roles, scan: ScanResult | None, mode: str, expect: str,
          facts: dict, stub_root: Any = None) -> dict:
    root = contents.root
    total = _tensor_stats(root)
    devices_root = stub_root if stub_root is not None else root
    out: dict[str, Any] = {
        "path": contents.path,
        "format": contents.format,
        "files": len(contents.files),
        "file_bytes": contents.total_bytes,
        "tensors": total["tensors"],
        "tensor_bytes": total["bytes"],
        "dtypes": total["dtypes"],
        "devices": _tensor_stats(devices_root)["devices"],
        "entries": entries(root, roles),
        "roles": {
            "model": None if roles.model is None else {
                "path": roles.model.path or "<root>", "tensors": len(roles.model.tensors),
                "bytes": sum(t.nbytes for t in roles.model.tensors.values()),
                "pickled_module": roles.model.full_pickle_class},
            "other_weights": [m.path or "<root>" for m in roles.extra_weights],
            "optimizer": [{"path": o.path or "<root>", "param_groups": len(o.param_groups),
                           "params": len(o.param_ids), "states": len(o.state)} for o in roles.optimizers],
            "scheduler": roles.schedulers,
            "scaler": roles.scalers,
            "rng": roles.rng,
            "progress": roles.progress,
            "config": roles.config,
        },
        "expect": expect,
        "judged_as": mode,
        "weights_only_load": weights_only_verdict(contents),
    }
    if contents.metadata:
        out["format_metadata"] = {plain(k, 100): plain(v) if not isinstance(v, (dict, list)) else brief(v, 200)
                                  for k, v in list(contents.metadata.items())[:50]}
    if scan is not None:
        out["scan"] = {"tensors": scan.tensors_scanned, "storages": scan.storages_scanned,
                       "bytes": scan.bytes_scanned, "seconds": round(scan.seconds, 3), "backend": scan.backend,
                       "nonfinite_tensors": len(scan.hits), "not_scanned": scan.not_scanned[:20]}
    if contents.notes:
        out["notes"] = contents.notes[:20]
    if facts:
        out["facts"] = facts
    return out


def weights_only_verdict(contents: Contents) -> str:
    """What ``torch.load(weights_only=True)`` would do with the pickles (static mirror)."""
    from torchdoctor.checkpoint.allowlist import is_numpy_array_global, is_weights_only_global

    if not contents.pickles:
        return "not applicable (no pickle)"
    if contents.format == "dcp":
        return "not applicable (DCP loads its own metadata)"
    from torchdoctor.checkpoint.pickle_globals import AUX_PICKLES

    bad, numpy = False, False
    aux = sorted({a for p in contents.pickles for a in AUX_PICKLES if a in p.name})
    for p in contents.pickles:
        if any(a in p.name for a in AUX_PICKLES):
            continue
        for g in p.globals:
            if not is_weights_only_global(g):
                if is_numpy_array_global(g):
                    numpy = True
                else:
                    bad = True
        if p.unsupported_ops or "module" in p.persistent_kinds:
            bad = True
    out = "refused" if bad else "loads after allowlisting numpy globals" if numpy else "loads"
    return out + (f" ({', '.join(aux)}: refused, not needed to resume)" if aux else "")
