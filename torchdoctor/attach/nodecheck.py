"""Another node's attach summary as node 0 reads it: input from a stranger (docs/attach.md,
"Multi-node").

What reaches node 0's gather port is bytes anyone who can reach the port may have written. It is
read under the bounds of the ranked run's summaries (:mod:`torchdoctor.distributed.peer`:
``MAX_BYTES``, ``MAX_ITEMS`` JSON values; the gather port refuses more before reading it), then
every value is checked against :data:`SUMMARY`, the shape :func:`torchdoctor.attach.nodes.summary`
writes: a type per field (a finite number where the views compute, an int where they index, a
string capped where they render), a bound per list. What does not fit is left out, and each kind
of thing left out is one *reason* (the ``node-summary-invalid`` finding says them), never a
crash. Strings keep their bytes (control bytes are escaped where they are rendered, ``safe.py``);
lone surrogates become ``\\udXXX`` text.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.distributed.peer import MAX_REASONS, decode, number, shown, text

VERSION = 1
KIND = "attach"
PID_MAX = 1 << 22  # Linux's highest pid_max
RANK_MAX = 1_000_000
MAX_PROCS = 4096  # processes of one node (ranks and their workers)
MAX_SAMPLES = 64  # stack samples per process (attach takes 5)
MAX_THREADS = 256
MAX_FRAMES = 128
MAX_SERIES = 7300  # resource snapshots (one a second over the longest --duration, twice)
MAX_GPUS = 64
PATH = 1000  # characters of a file path
SHORT = 300


def _int(lo: int, hi: int) -> tuple:
    return ("int", lo, hi)


def _str(limit: int = SHORT) -> tuple:
    return ("str", limit)


def _opt(spec: tuple) -> tuple:
    return ("opt", spec)


def _list(spec: tuple, most: int) -> tuple:
    return ("list", spec, most)


def _dict(fields: dict, required: tuple = ()) -> tuple:
    return ("dict", fields, frozenset(required))


def _map(key: tuple, value: tuple, most: int) -> tuple:
    return ("map", key, value, most)


NUM = ("num",)
BOOL = ("bool",)
COUNTER = _int(0, 10**15)
FRAME = _dict({"name": _str(), "file": _str(PATH), "line": _int(-1, 10**9)}, ("name", "file", "line"))
THREAD = _dict({"tid": _opt(_int(0, 1 << 62)), "name": _str(), "active": BOOL, "gil": BOOL,
                "frames": _list(FRAME, MAX_FRAMES)}, ("frames",))
WAKES = _dict({"switches": COUNTER, "cpu_ns": _opt(COUNTER)}, ("switches",))
SAMPLE = _dict({"t": NUM, "read_s": _opt(NUM), "threads": _list(THREAD, MAX_THREADS), "error": _str(600),
                "kind": ("enum", frozenset({"permission", "gone", "not-python", "other"})),
                "main_before": WAKES, "main_after": WAKES}, ("t",))
GIL_THREAD = _dict({"tid": _opt(_int(0, 1 << 62)), "name": _str(), "samples": COUNTER, "top": _str(),
                    "top_samples": COUNTER}, ("tid", "name", "samples", "top", "top_samples"))
GIL = _dict({"rate_hz": NUM, "seconds": NUM, "threads": _list(GIL_THREAD, MAX_THREADS), "error": _str(600)})
PROCESS = _dict({
    "pid": _int(1, PID_MAX - 1), "rank": _opt(_int(0, RANK_MAX)), "local_rank": _opt(_int(0, RANK_MAX)),
    "role": ("enum", frozenset({"rank", "worker", "process"})), "parent": _opt(_int(1, PID_MAX - 1)),
    "samples": _list(SAMPLE, MAX_SAMPLES), "cmdline": _str(), "status": _str(40), "gil": _opt(GIL),
    "workers_at_end": _list(_int(1, PID_MAX - 1), 4096), "source": _map(_str(PATH + 20), _str(), 16)},
    ("pid", "role", "samples"))
GPU = _dict({"gpu": _int(0, 4096), "mem": _opt(COUNTER), "util": _opt(NUM), "power_w": _opt(NUM)})
PROC_RES = _dict({"rss": COUNTER, "status": _str(40), "cpu": NUM, "gpu": _list(GPU, MAX_GPUS)})
SNAPSHOT = _dict({"t": NUM, "procs": _map(("pidkey",), PROC_RES, MAX_PROCS)}, ("t", "procs"))
SIZES = _list(_list(_int(-1, 1 << 62), 16), 64)
BRIEF = _dict({"seq": _opt(_int(-1, 1 << 62)), "op": _str(), "state": _opt(_str(40)),
               "pg": _opt(("pg",)), "input_sizes": _opt(SIZES), "output_sizes": _opt(SIZES)})
FR_PG = _dict({"entries": COUNTER, "last_completed": _opt(BRIEF), "first_pending": _opt(BRIEF)})
FR_RANK = _dict({"error": _str(600), "file": _str(PATH), "version": _str(40), "entries": COUNTER,
                 "pg": _opt(_str()), "last_completed": _opt(BRIEF), "first_pending": _opt(BRIEF),
                 "pgs": _map(_str(), FR_PG, 256)})
FLIGHT = _dict({"state": ("enum", frozenset({"off", "not-applicable", "not-enabled", "read"})),
                "reason": _str(600), "how": _str(600), "ranks": _map(("rankkey",), FR_RANK, 4096)},
               ("state",))
SUMMARY = _dict({
    "v": _int(VERSION, VERSION), "kind": ("enum", frozenset({KIND})), "node_rank": _int(1, 1 << 20),
    "facts": _dict({"hostname": _str()}), "duration_s": NUM, "elapsed_s": NUM,
    "stack_samples": _int(0, MAX_SAMPLES),
    "sampler": _dict({"tool": _str(40), "version": _opt(_str(40)), "blocking": BOOL, "native": BOOL}),
    "job": _dict({"launcher_pid": _opt(_int(1, PID_MAX - 1)), "run_id": _opt(_str()),
                  "world_size": _opt(_int(0, RANK_MAX))}),
    "processes": _list(PROCESS, MAX_PROCS),
    "resources": _dict({"interval_s": NUM, "series": _list(SNAPSHOT, MAX_SERIES), "nvml": BOOL,
                        "nvml_reason": _opt(_str(600)), "host_available": _opt(COUNTER)}),
    "flight_recorder": FLIGHT, "error": _str(600)},
    ("v", "kind", "node_rank", "processes"))

_DROP = object()


class _Checker:
    def __init__(self) -> None:
        self.reasons: dict[str, int] = {}

    def bad(self, where: str, what: str) -> object:
        key = f"{where}: {what}"
        self.reasons[key] = self.reasons.get(key, 0) + 1
        return _DROP

    def clean(self, v: Any, spec: tuple, where: str) -> Any:
        kind = spec[0]
        if kind == "opt":
            return None if v is None else self.clean(v, spec[1], where)
        if kind == "int":
            if type(v) is not int or not spec[1] <= v <= spec[2]:
                return self.bad(where, f"not an integer in {spec[1]}..{spec[2]} ({shown(v, 40)})")
            return v
        if kind == "num":
            return v if number(v) else self.bad(where, f"not a finite number ({shown(v, 40)})")
        if kind == "bool":
            return v if type(v) is bool else self.bad(where, "not true/false")
        if kind == "str":
            return text(v, spec[1]) if isinstance(v, str) else self.bad(where, "not a string")
        if kind == "enum":
            return v if isinstance(v, str) and v in spec[1] else self.bad(where, f"unknown value {shown(v, 40)}")
        if kind in ("pidkey", "rankkey"):
            ok = isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 8
            return v if ok else self.bad(where, f"not a number key ({shown(v, 40)})")
        if kind == "pg":  # a process group: its name, or [name, description]
            if isinstance(v, (str, int)) and type(v) is not bool:
                return text(str(v), SHORT)
            if isinstance(v, list) and len(v) <= 4 and all(isinstance(x, str) for x in v):
                return [text(x, SHORT) for x in v]
            return self.bad(where, "not a process group")
        if kind == "list":
            if not isinstance(v, list):
                return self.bad(where, "not a list")
            if len(v) > spec[2]:
                self.bad(where, f"more than {spec[2]} items (the rest left out)")
            out = [self.clean(x, spec[1], where + "[]") for x in v[:spec[2]]]
            return [x for x in out if x is not _DROP]
        if kind == "map":
            if not isinstance(v, dict):
                return self.bad(where, "not an object")
            if len(v) > spec[3]:
                self.bad(where, f"more than {spec[3]} entries (the rest left out)")
            out = {}
            for k, x in list(v.items())[:spec[3]]:
                k2 = self.clean(k, spec[1], where + " key")
                x2 = self.clean(x, spec[2], f"{where}[]") if k2 is not _DROP else _DROP
                if x2 is not _DROP:
                    out[k2] = x2
            return out
        assert kind == "dict", kind
        if not isinstance(v, dict):
            return self.bad(where, "not an object")
        out = {}
        for k, x in v.items():
            sub = spec[1].get(k) if isinstance(k, str) else None
            if sub is None:
                self.bad(where, f"unknown field {shown(k, 40)}")
                continue
            x2 = self.clean(x, sub, f"{where}.{k}")
            if x2 is not _DROP:
                out[k] = x2
        missing = [k for k in spec[2] if k not in out]
        if missing:
            return self.bad(where, f"no valid {', '.join(missing)}")
        return out


def parse(blob: bytes, node_rank: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Bytes from the gather port → (the checked summary, or None when nothing can be used; reasons)."""
    data, why = decode(blob)
    if why:
        return None, [why]
    return check(data, node_rank)


def check(data: Any, node_rank: int) -> tuple[dict[str, Any] | None, list[str]]:
    if not isinstance(data, dict):
        return None, [f"its summary is a JSON {type(data).__name__}, not an object"]
    if data.get("kind") != KIND or data.get("v") != VERSION:
        return None, [f"its summary is not an attach summary of version {VERSION} (kind "
                      f"{shown(data.get('kind'), 40)}, version {shown(data.get('v'), 40)}): run the "
                      f"same torchdoctor command on every node"]
    c = _Checker()
    out = c.clean(data, SUMMARY, "summary")
    if out is not _DROP and out["node_rank"] != node_rank:
        c.bad("summary.node_rank", f"{out['node_rank']} sent as node {node_rank}")
        out = _DROP
    if out is not _DROP:
        out = _consistent(out, c)
    reasons = [f"{k}" + (f" ({n} times)" if n > 1 else "") for k, n in c.reasons.items()]
    if len(reasons) > MAX_REASONS:
        reasons = reasons[:MAX_REASONS] + [f"{len(reasons) - MAX_REASONS} more kinds of invalid values"]
    return (None if out is _DROP else out), reasons


def _consistent(s: dict[str, Any], c: _Checker) -> dict[str, Any]:
    """Cross-field checks: pids unique, a worker's parent among the node's processes, resource and
    Flight Recorder keys naming the node's own processes and ranks."""
    seen: set[int] = set()
    procs = []
    for p in s["processes"]:
        if p["pid"] in seen:
            c.bad("summary.processes[].pid", "a pid given twice")
            continue
        seen.add(p["pid"])
        procs.append(p)
    pids = {p["pid"] for p in procs}
    procs = [p for p in procs if p.get("parent") is None or p["parent"] in pids
             or c.bad("summary.processes[].parent", "a parent that is not among the node's processes") is None]
    s["processes"] = procs
    keys = {str(p["pid"]) for p in procs}
    for snap in (s.get("resources") or {}).get("series") or []:
        extra = [k for k in snap["procs"] if k not in keys]
        if extra:
            c.bad("summary.resources.series[].procs", "a pid that is not among the node's processes")
            snap["procs"] = {k: v for k, v in snap["procs"].items() if k in keys}
    ranks = {str(p["rank"]) for p in procs if p.get("rank") is not None and p["role"] == "rank"}
    fr = s.get("flight_recorder") or {}
    if isinstance(fr.get("ranks"), dict) and any(r not in ranks for r in fr["ranks"]):
        c.bad("summary.flight_recorder.ranks", "a rank that is not among the node's ranks")
        fr["ranks"] = {r: d for r, d in fr["ranks"].items() if r in ranks}
    return s
