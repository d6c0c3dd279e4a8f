"""Numbers pulled out of a recognised error text: bytes requested/free/allocated, ranks, shapes.

Each extractor takes the matched text (the error line and the lines it wraps onto) and the
entry's regex match, and returns a flat dict. Sizes are returned in bytes (``*_bytes``), parsed
from PyTorch's own formatting ("2.00 GiB", "3.44 MiB"; decimal units for "GB"/"MB").
"""

from __future__ import annotations

import re

_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|[kmgtp]?i?b)\b"


def to_bytes(value: str, unit: str) -> int:
    return int(round(float(value) * _UNITS[unit.lower()]))


def human(n: int | float) -> str:
    """Bytes in PyTorch's style: 1.50 GiB, 512.00 MiB, 12 B."""
    n = float(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _size(rx: str, text: str) -> int | None:
    m = re.search(rx, text, re.I)
    if not m:
        return None
    return to_bytes(m.group("v"), m.group("u"))


def _sz(prefix: str = "", suffix: str = "") -> str:
    return prefix + r"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>bytes|[kmgtp]?i?b)\b" + suffix


def oom(text: str, m: re.Match | None = None) -> dict:
    """CUDA/MPS OOM: both the torch >= 2.1 wording and the older parenthesised one."""
    out: dict = {}
    fields = {
        "requested_bytes": [_sz(r"tried to allocate\s+")],
        "capacity_bytes": [_sz(r"total capacity of\s+"), _sz("", r"\s+total capacity")],
        "free_bytes": [_sz(r"of which\s+", r"\s+is free"), _sz(r";\s*", r"\s+free\b")],
        "process_in_use_bytes": [_sz(r"this process has\s+", r"\s+memory in use")],
        "allocated_bytes": [_sz("", r"\s+is allocated by pytorch"), _sz("", r"\s+already allocated"),
                            _sz(r"mps allocated:\s*")],
        "reserved_unallocated_bytes": [_sz("", r"\s+is reserved by pytorch but unallocated")],
        "reserved_bytes": [_sz("", r"\s+reserved in total by pytorch")],
        "other_allocations_bytes": [_sz(r"other allocations:\s*")],
        "max_allowed_bytes": [_sz(r"max allowed:\s*")],
    }
    for name, rxs in fields.items():
        for rx in rxs:
            v = _size(rx, text)
            if v is not None:
                out[name] = v
                break
    g = re.search(r"\bGPU (\d+)\b", text)
    if g:
        out["gpu"] = int(g.group(1))
    others = re.findall(r"Process (\d+) has " + SIZE + r" memory in use", text, re.I)
    if others:
        out["other_processes"] = [{"pid": int(p), "bytes": to_bytes(v, u)} for p, v, u in others]
    if "reserved_bytes" not in out and "allocated_bytes" in out and "reserved_unallocated_bytes" in out:
        out["reserved_bytes"] = out["allocated_bytes"] + out["reserved_unallocated_bytes"]
    return out


def oom_notes(n: dict) -> list[str]:
    """Plain statements read off the OOM numbers (no guessing beyond them)."""
    notes = []
    req, free = n.get("requested_bytes"), n.get("free_bytes")
    if req is not None and free is not None:
        notes.append(f"requested {human(req)} with {human(free)} free on the device")
    cap, alloc, res = n.get("capacity_bytes"), n.get("allocated_bytes"), n.get("reserved_bytes")
    if cap and alloc is not None:
        notes.append(f"PyTorch tensors hold {human(alloc)} of {human(cap)} ({100 * alloc / cap:.0f}%)")
    unalloc = n.get("reserved_unallocated_bytes")
    if unalloc is None and res is not None and alloc is not None:
        unalloc = res - alloc
    if unalloc is not None and req is not None and unalloc >= req:
        notes.append(f"{human(unalloc)} is reserved but unallocated, more than the request: fragmentation; "
                     "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first")
    other = sum(p["bytes"] for p in n.get("other_processes", []))
    if other and cap and other >= 0.05 * cap:
        notes.append(f"other processes hold {human(other)} on this GPU")
    return notes


def cpu_alloc(text: str, m: re.Match | None = None) -> dict:
    g = re.search(r"you tried to allocate (\d+) bytes", text)
    return {"requested_bytes": int(g.group(1))} if g else {}


def pid_signal(text: str, m: re.Match | None = None) -> dict:
    g = re.search(r"\(pid (\d+)\) is killed by signal: ?([\w ]+)", text)
    return {"pid": int(g.group(1)), "signal": g.group(2).strip()} if g else {}


def groups(text: str, m: re.Match | None = None) -> dict:
    """The entry regex's named groups, with integers converted."""
    if m is None:
        return {}
    out = {}
    gd = m.groupdict()
    for k, v in gd.items():
        if v is None:
            continue
        if k[-1].isdigit() and k[:-1] in gd:  # "suggested2": the same number in another alternative
            k = k[:-1]
        out[k] = int(v) if re.fullmatch(r"-?\d+", v) else v.strip()
    return out


def devices(text: str, m: re.Match | None = None) -> dict:
    g = re.search(r"at least two devices, ([\w:]+) and ([\w:]+)", text)
    return {"devices": [g.group(1), g.group(2)]} if g else {}


def nccl_timeout(text: str, m: re.Match | None = None) -> dict:
    out: dict = {}
    for name, rx in (("seq", r"SeqNum=(\d+)"), ("op", r"OpType=(\w+)"), ("numel_in", r"NumelIn=(\d+)"),
                     ("numel_out", r"NumelOut=(\d+)"), ("timeout_ms", r"Timeout\(ms\)=(\d+)"),
                     ("ran_ms", r"ran for (\d+) milliseconds"), ("rank", r"\[Rank (\d+)\]")):
        g = re.search(rx, text, re.I)
        if g:
            out[name] = int(g.group(1)) if g.group(1).isdigit() else g.group(1)
    return out


def nccl_error(text: str, m: re.Match | None = None) -> dict:
    out = groups(text, m)
    g = re.search(r"NCCL version ([\d.]+)", text)
    if g:
        out["nccl_version"] = g.group(1)
    g = re.search(r"Last error:\s*(.+)", text)
    if g:
        out["last_error"] = g.group(1).strip()
    return out


def state_dict_keys(text: str, m: re.Match | None = None) -> dict:
    out = groups(text, m)
    for name, rx in (("missing", r"Missing key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n|\. \s*Unexpected|$)"),
                     ("unexpected", r"Unexpected key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n|$)")):
        g = re.search(rx, text, re.S)
        if g:
            keys = re.findall(r'"([^"]+)"', g.group(1))
            out[f"{name}_keys"] = len(keys)
            out[f"{name}_examples"] = keys[:3]
    prefixes = sorted({p for p in ("module.", "_orig_mod.") if f'"{p}' in text})
    if prefixes:
        out["key_prefixes"] = prefixes
    return out


def globals_(text: str, m: re.Match | None = None) -> dict:
    names = re.findall(r"GLOBAL ([\w.]+) was not an allowed global", text)
    return {"globals": sorted(set(names))} if names else {}


EXTRACTORS: dict[str, object] = {
    "oom": oom, "cpu_alloc": cpu_alloc, "pid_signal": pid_signal, "groups": groups, "devices": devices,
    "nccl_timeout": nccl_timeout, "nccl_error": nccl_error, "state_dict_keys": state_dict_keys,
    "globals": globals_,
}


def extract(name: str | None, text: str, m: re.Match | None) -> dict:
    if not name:
        return {}
    try:
        return EXTRACTORS[name](text, m)
    except (ValueError, KeyError, IndexError):  # a malformed number never breaks the answer
        return {}
