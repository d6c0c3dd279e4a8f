"""Numbers pulled out of a recognised error text: bytes requested/free/allocated, ranks, shapes.

One set of extractors for ``ask`` (a row's ``numbers`` names one) and the crash rule (``oom``,
``device_details``, ``inplace_details``, ``refused_global`` on an exception's message).
Each extractor takes the matched text (the error line and the lines it wraps onto) and the
entry's regex match, and returns a flat dict. Sizes are returned in bytes (``*_bytes``), parsed
from PyTorch's own formatting ("2.00 GiB", "3.44 MiB"; decimal units for "GB"/"MB").

Hostile input is expected (a pasted log is untrusted): every number pattern starts at the first
digit of a run (a look-behind for a digit or a dot), so a long digit run costs one pass, not one
pass per digit; a number of more than ``MAX_DIGITS`` digits is not a real size or count and is
reported by name in ``too_large`` instead of being converted (no OverflowError, no huge int).
"""

from __future__ import annotations

import math
import re

_UNITS = {"b": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
MAX_DIGITS = 24  # more digits than any real byte count, pid or rank (2**64 has 20)
_NUM = r"(?<![\d.])\d+(?:\.\d+)?"  # starts at the first digit of a run: linear on long runs
SIZE = r"(" + _NUM + r")\s*(bytes|[kmgtp]?i?b)\b"


class TooLarge(ValueError):
    """A number with more digits than any real size: reported, never converted."""


def to_int(value: str) -> int:
    """``int(value)`` for at most MAX_DIGITS digits; TooLarge beyond (no 4300-digit ints)."""
    if len(value.lstrip("-+")) > MAX_DIGITS:
        raise TooLarge(value)
    return int(value)


def to_bytes(value: str, unit: str) -> int:
    if len(value.split(".")[0]) > MAX_DIGITS:
        raise TooLarge(value)
    v = float(value[: MAX_DIGITS * 2 + 1]) * _UNITS[unit.lower()]
    if not math.isfinite(v):
        raise TooLarge(value)
    return int(round(v))


def human(n: int | float) -> str:
    """Bytes in PyTorch's style: 1.50 GiB, 512.00 MiB, 12 B."""
    n = float(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _size(rx: str, text: str) -> int | None:
    m = _re(rx, re.I).search(text)
    if not m:
        return None
    return to_bytes(m.group("v"), m.group("u"))


_RX: dict[tuple[str, int], re.Pattern] = {}


def _re(p: str, flags: int = 0) -> re.Pattern:
    rx = _RX.get((p, flags))
    if rx is None:
        rx = _RX[(p, flags)] = re.compile(p, flags)
    return rx


def _sz(prefix: str = "", suffix: str = "") -> str:
    return prefix + r"(?P<v>" + _NUM + r")\s*(?P<u>bytes|[kmgtp]?i?b)\b" + suffix


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
    too_large: list[str] = []
    for name, rxs in fields.items():
        for rx in rxs:
            try:
                v = _size(rx, text)
            except TooLarge:
                too_large.append(name)
                break
            if v is not None:
                out[name] = v
                break
    g = _re(r"\bGPU (\d+)\b").search(text)
    if g:
        _put(out, too_large, "gpu", g.group(1))
    procs = []
    for p, v, u in _re(r"Process (\d+) has " + SIZE + r" memory in use", re.I).findall(text):
        try:
            procs.append({"pid": to_int(p), "bytes": to_bytes(v, u)})
        except TooLarge:
            too_large.append("other_processes")
    if procs:
        out["other_processes"] = procs
    if too_large:
        out["too_large"] = sorted(set(too_large))
    if "reserved_bytes" not in out and "allocated_bytes" in out and "reserved_unallocated_bytes" in out:
        out["reserved_bytes"] = out["allocated_bytes"] + out["reserved_unallocated_bytes"]
    return out


def _put(out: dict, too_large: list[str], name: str, digits: str) -> None:
    try:
        out[name] = to_int(digits)
    except TooLarge:
        too_large.append(name)


def oom_notes(n: dict) -> list[str]:
    """Plain statements read off the OOM numbers (no guessing beyond them)."""
    notes = []
    if n.get("too_large"):
        names = ", ".join(x.removesuffix("_bytes").replace("_", " ") for x in n["too_large"])
        notes.append(f"too large to be a real size: {names} (a shape or dtype bug computing the size, "
                     "or an edited message)")
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
    g = _re(r"you tried to allocate (\d+) bytes").search(text)
    out: dict = {}
    too_large: list[str] = []
    if g:
        _put(out, too_large, "requested_bytes", g.group(1))
    if too_large:
        out["too_large"] = too_large
    return out


def pid_signal(text: str, m: re.Match | None = None) -> dict:
    g = _re(r"\(pid (\d+)\) is killed by signal: ?(\w[\w ]{0,40})").search(text)
    if not g:
        return {}
    out: dict = {"signal": g.group(2).strip()}
    too_large: list[str] = []
    _put(out, too_large, "pid", g.group(1))
    if too_large:
        out["too_large"] = too_large
    return out


def groups(text: str, m: re.Match | None = None) -> dict:
    """The entry regex's named groups, with integers converted."""
    if m is None:
        return {}
    out: dict = {}
    too_large: list[str] = []
    gd = m.groupdict()
    for k, v in gd.items():
        if v is None:
            continue
        if k[-1].isdigit() and k[:-1] in gd:  # "suggested2": the same number in another alternative
            k = k[:-1]
        if _re(r"-?\d+").fullmatch(v):
            _put(out, too_large, k, v)
        else:
            out[k] = _clip(v.strip())
    if too_large:
        out["too_large"] = too_large
    return out


MAX_VALUE = 200  # characters of a text value quoted back (a group may match a whole long line)


def _clip(v: str) -> str:
    return v if len(v) <= MAX_VALUE else v[:MAX_VALUE] + "…"


def devices(text: str, m: re.Match | None = None) -> dict:
    g = _re(r"at least two devices, ([\w:]{1,40}) and ([\w:]{1,40})").search(text)
    return {"devices": [g.group(1), g.group(2)]} if g else {}


def nccl_timeout(text: str, m: re.Match | None = None) -> dict:
    out: dict = {}
    too_large: list[str] = []
    for name, rx in (("seq", r"SeqNum=(\d+)"), ("op", r"OpType=(\w+)"), ("numel_in", r"NumelIn=(\d+)"),
                     ("numel_out", r"NumelOut=(\d+)"), ("timeout_ms", r"Timeout\(ms\)=(\d+)"),
                     ("ran_ms", r"ran for (\d+) milliseconds"), ("rank", r"\[Rank (\d+)\]")):
        g = _re(rx, re.I).search(text)
        if g:
            v = g.group(1)
            if v.isdigit():
                _put(out, too_large, name, v)
            else:
                out[name] = _clip(v)
    if too_large:
        out["too_large"] = too_large
    return out


def nccl_error(text: str, m: re.Match | None = None) -> dict:
    out = groups(text, m)
    g = _re(r"NCCL version (\d[\d.]{0,20})").search(text)
    if g:
        out["nccl_version"] = g.group(1)
    g = _re(r"Last error:[ \t]*(.+)").search(text)
    if g:
        out["last_error"] = _clip(g.group(1).strip())
    return out


def state_dict_keys(text: str, m: re.Match | None = None) -> dict:
    out = groups(text, m)
    for name, head, stop in (("missing", "Missing key(s) in state_dict: ", "Unexpected key(s) in state_dict"),
                             ("unexpected", "Unexpected key(s) in state_dict: ", None)):
        start = text.find(head)
        if start < 0:
            continue
        start += len(head)
        end = text.find("\n", start)
        seg = text[start:end if end >= 0 else len(text)]
        if stop and stop in seg:
            seg = seg[:seg.index(stop)]
        keys = _re(r'"([^"\n]{1,300})"').findall(seg)
        out[f"{name}_keys"] = len(keys)
        out[f"{name}_examples"] = [_clip(k) for k in keys[:3]]
    prefixes = sorted({p for p in ("module.", "_orig_mod.") if f'"{p}' in text})
    if prefixes:
        out["key_prefixes"] = prefixes
    return out


def globals_(text: str, m: re.Match | None = None) -> dict:
    names = _re(r"GLOBAL ([\w.]{1,300}) was not an allowed global").findall(text)
    return {"globals": sorted(set(names))[:20]} if names else {}


def device_details(text: str, m: re.Match | None = None) -> dict:
    """The devices, argument and op of a device-mismatch crash (the crash finding's evidence)."""
    out: dict = {}
    g = _re(r"found at least two devices, (\S+) and (\S+?)!?( \(|$)").search(text)
    if g:
        out["devices"] = [g.group(1).rstrip("!,"), g.group(2).rstrip("!,")]
    g = _re(r"Tensor on device (\S+) is not on the expected device (\S+?)!").search(text)
    if g and "devices" not in out:
        out["devices"] = [g.group(2), g.group(1)]
    g = _re(r"argument for argument (\w+) in method (\w+)").search(text)
    if g:
        out["argument"] = g.group(1)
        out["op"] = g.group(2)
    g = _re(r"Input type \((\S+)\) and weight type \((\S+)\)").search(text)
    if g:
        out["input_type"], out["weight_type"] = g.group(1), g.group(2)
    return out


def inplace_details(text: str, m: re.Match | None = None) -> dict:
    """The tensor, its producing op and versions of an in-place-modified crash."""
    out: dict = {}
    g = _re(r"\[(torch\.\S+) \[([\d, ]*)\]\], which is output (\d+) of (\w+), is at version "
            r"(\d+); expected version (\d+)").search(text)
    if g:
        out["tensor"] = f"{g.group(1)} [{g.group(2)}]"
        out["output_of"] = g.group(4)
        out["version"] = f"{g.group(5)} (expected {g.group(6)})"
    return out


def refused_global(text: str, m: re.Match | None = None) -> dict:
    """The global torch.load(weights_only=True) refused ("Unsupported global: GLOBAL a.b")."""
    g = _re(r"Unsupported global: GLOBAL ([\w.]+)").search(text)
    return {"global": g.group(1)} if g else {}


EXTRACTORS: dict[str, object] = {
    "oom": oom, "cpu_alloc": cpu_alloc, "pid_signal": pid_signal, "groups": groups, "devices": devices,
    "nccl_timeout": nccl_timeout, "nccl_error": nccl_error, "state_dict_keys": state_dict_keys,
    "globals": globals_, "device_details": device_details, "inplace_details": inplace_details,
    "refused_global": refused_global,
}


def extract(name: str | None, text: str, m: re.Match | None) -> dict:
    if not name:
        return {}
    try:
        return EXTRACTORS[name](text, m)
    except (ValueError, KeyError, IndexError, OverflowError):  # a malformed number never breaks the answer
        return {}
