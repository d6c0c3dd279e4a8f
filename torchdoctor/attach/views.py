"""Pure views of the attach evidence: where each process is, whether it moved, grouped by place.

No I/O and no torch: the rules (``torchdoctor/rules/attach.py``) and the console section read
these. A *place* is the main thread's innermost frame in the user's code (not the standard
library, not an installed package), with what it is inside: a collective of
``torch.distributed`` (the op), the DataLoader's ``__next__``, or neither. A process is *stuck*
when its main thread showed the same stack in every sample over the window (at least
:data:`MIN_SAMPLES`), *moving* otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIN_SAMPLES = 3  # samples needed before "the same stack in every sample" means stuck
# seconds between dumps a waiting main thread must stay asleep before "blocked for good" is said: a
# slow rank's Python-bound step took longer than a 3 s window on the loaded test box (its peer never
# woke in 2.1 s between dumps), so a short window cannot tell a livelock from one long step
MIN_QUIET_S = 5.0

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "batch_isend_irecv", "_all_gather_base", "_reduce_scatter_base",
})
C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")
DATALOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")
LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3")
CUDA_INIT = os.path.join("torch", "cuda", "__init__.py")
CUDA_STREAMS = os.path.join("torch", "cuda", "streams.py")
# a user line that makes the host wait for the device (C methods: no Python frame of their own)
SYNC_CALLS = (".item()", ".cpu()", ".tolist()", ".numpy()", "synchronize(", ".to(\"cpu\")", ".to('cpu')")


def sync_call(frames: list[dict], source: str) -> str | None:
    """What makes the host wait for the device here: a torch.cuda synchronize frame, or a sync
    call on the user's line (its source text); None when neither."""
    for f in frames:
        if (f["file"].endswith(CUDA_INIT) or f["file"].endswith(CUDA_STREAMS)) and \
                f["name"].split(".")[-1] == "synchronize":
            return f["name"]
    for call in SYNC_CALLS:
        if call in source:
            return call.strip(".(")
    return None


def is_native(frame: dict) -> bool:
    """A native frame of ``--native`` (a shared object, no Python line)."""
    path = frame["file"]
    return frame.get("line", 0) <= 0 or path.endswith(".so") or ".so." in path


def is_user_file(path: str) -> bool:
    return not path.startswith("<") and not any(m in path for m in LIBRARY_MARKS)


@dataclass(frozen=True)
class Place:
    kind: str  # "collective" | "dataloader" | "code" | "gone" | "unreadable"
    op: str  # the collective's name, "DataLoader.__next__", or the user function
    file: str  # the user's file (full path) or ""
    line: int
    function: str  # the user's function at that line

    @property
    def at(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}" if self.file else "?"

    def key(self) -> tuple:
        return (self.kind, self.op, self.file, self.line)

    def words(self) -> str:
        if self.kind == "collective":
            return f"wait in {self.op} at {self.at}"
        if self.kind == "dataloader":
            return f"wait in DataLoader.__next__ at {self.at}"
        if self.kind == "gone":
            return "ended"
        if self.kind == "unreadable":
            return "could not be read"
        return f"run {self.function} at {self.at}"


def main_thread(threads: list[dict], pid: int) -> dict | None:
    for t in threads:
        if t.get("name") == "MainThread":
            return t
    for t in threads:
        if t.get("tid") == pid:
            return t
    return threads[-1] if threads else None


def place_of(frames: list[dict]) -> Place:
    """Frames innermost first → the place (see module docstring)."""
    op, kind = "", "code"
    for f in frames:  # innermost first: the outermost library frame of interest wins below
        if f["file"].endswith(C10D_FILE) and f["name"].split(".")[-1] in COLLECTIVES:
            op, kind = f["name"].split(".")[-1], "collective"
        elif kind != "collective" and f["file"].endswith(DATALOADER_FILE) and "__next__" in f["name"]:
            op, kind = "DataLoader.__next__", "dataloader"
    for f in frames:
        if is_user_file(f["file"]) and not is_native(f):
            return Place(kind, op or f["name"], f["file"], f["line"], f["name"])
    python = [f for f in frames if not is_native(f)] or frames
    top = python[0] if python else {"file": "", "line": 0, "name": "?"}
    return Place(kind, op or top["name"], top["file"], top["line"], top["name"])


def signature(frames: list[dict]) -> tuple:
    return tuple((f["file"], f["line"], f["name"]) for f in frames)


@dataclass(frozen=True)
class ProcView:
    pid: int
    rank: int | None
    role: str  # "rank" | "worker" | "process"
    parent: int | None
    place: Place  # at the last readable sample
    samples: int  # readable samples
    distinct: int  # distinct main-thread stacks among them
    same_for_s: float  # how long the last stack has been seen unchanged (first → last sample)
    window_s: float
    gone: bool
    status: str  # last psutil status ("zombie", "sleeping", ...), "" if unknown
    kinds_seen: frozenset = frozenset()  # the place kinds of every readable sample
    collective_share: float = 0.0  # share of the readable samples inside a collective
    main_wakes: int | None = None  # main thread switched out between dumps (None: not read)
    quiet_s: float = 0.0  # the time between dumps those wakes were counted over
    cpu_s: float | None = None  # main thread CPU seconds from the first dump to the last

    @property
    def asleep(self) -> bool:
        """The main thread never ran between dumps over at least MIN_QUIET_S: blocked for good."""
        return self.main_wakes == 0 and self.quiet_s >= MIN_QUIET_S

    @property
    def stuck(self) -> bool:
        return not self.gone and self.samples >= MIN_SAMPLES and self.distinct == 1

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def to_dict(self) -> dict:
        return {"pid": self.pid, "rank": self.rank, "role": self.role, "kind": self.place.kind,
                "op": self.place.op, "at": self.place.at, "file": self.place.file,
                "line": self.place.line, "function": self.place.function,
                "samples": self.samples, "distinct_stacks": self.distinct,
                "same_for_s": round(self.same_for_s, 1), "stuck": self.stuck, "gone": self.gone,
                "status": self.status, "main_wakes": self.main_wakes,
                "quiet_s": round(self.quiet_s, 2),
                "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 3)}


def view(proc: dict) -> ProcView:
    """One process of the evidence (``processes[i]``) → its view."""
    pid = int(proc["pid"])
    readable = [s for s in proc.get("samples", []) if "threads" in s]
    sigs: list[tuple[float, tuple, Place]] = []
    for s in readable:
        mt = main_thread(s["threads"], pid)
        if mt is not None:
            sigs.append((s["t"], signature(mt["frames"]), place_of(mt["frames"])))
    samples = proc.get("samples", [])
    gone = bool(samples) and samples[-1].get("kind") == "gone" or proc.get("status") == "gone"
    window = (samples[-1]["t"] - samples[0]["t"]) if len(samples) > 1 else 0.0
    if not sigs:
        place = Place("gone" if gone else "unreadable", "", "", 0, "")
        return ProcView(pid, proc.get("rank"), proc.get("role", "process"), proc.get("parent"),
                        place, 0, 0, 0.0, window, gone, str(proc.get("status", "")), frozenset())
    last_t, last_sig, place = sigs[-1]
    first_t = last_t
    for t, sig, _ in reversed(sigs):
        if sig != last_sig:
            break
        first_t = t
    wakes, quiet, cpu = wake_counts(readable)
    return ProcView(pid, proc.get("rank"), proc.get("role", "process"), proc.get("parent"),
                    place, len(sigs), len({s for _, s, _ in sigs}), last_t - first_t, window,
                    gone, str(proc.get("status", "")), frozenset(p.kind for _, _, p in sigs),
                    sum(p.kind == "collective" for _, _, p in sigs) / len(sigs), wakes, quiet, cpu)


def wake_counts(samples: list[dict]) -> tuple[int | None, float, float | None]:
    """(switches of the main thread between consecutive dumps, the seconds between them, its CPU
    seconds from the first dump to the last); (None, 0, None) when a counter is missing."""
    if len(samples) < 2 or any("main_before" not in s for s in samples):
        return None, 0.0, None
    wakes, quiet = 0, 0.0
    for a, b in zip(samples, samples[1:]):
        wakes += max(0, b["main_before"]["switches"] - a["main_after"]["switches"])
        quiet += max(0.0, b["t"] - (a["t"] + float(a.get("read_s") or 0.0)))
    first, last = samples[0]["main_before"].get("cpu_ns"), samples[-1]["main_after"].get("cpu_ns")
    cpu = (last - first) / 1e9 if isinstance(first, int) and isinstance(last, int) else None
    return wakes, quiet, cpu


def last_main_frames(proc: dict) -> list[dict]:
    for s in reversed(proc.get("samples") or []):
        if "threads" in s:
            mt = main_thread(s["threads"], int(proc["pid"]))
            return mt["frames"] if mt else []
    return []


def views(ev: dict) -> list[ProcView]:
    return [view(p) for p in ev.get("processes", [])]


def ranks_text(vs: list[ProcView]) -> str:
    ranked = [v for v in vs if v.rank is not None]
    if len(ranked) == len(vs) and vs:
        nums = ", ".join(str(v.rank) for v in sorted(vs, key=lambda v: v.rank))
        return f"rank{'s' if len(vs) > 1 else ''} {nums}"
    return ", ".join(v.label for v in vs)


def worker_text(v: ProcView) -> str:
    """"worker pid 812 of rank 1 runs Shards.__getitem__ at data.py:15, unchanged for 9.8 s ..."."""
    owner = f"rank {v.rank}" if v.rank is not None else f"pid {v.parent}"
    return describe(v.place, [v], who=f"worker pid {v.pid} of {owner}")


def groups(vs: list[ProcView]) -> list[tuple[Place, list[ProcView]]]:
    """Processes (ranks and plain PIDs, not workers) grouped by place, largest group first."""
    out: dict[tuple, tuple[Place, list[ProcView]]] = {}
    for v in vs:
        if v.role == "worker":
            continue
        out.setdefault(v.place.key(), (v.place, []))[1].append(v)
    return sorted(out.values(), key=lambda g: (
        -len(g[1]), min(v.rank if v.rank is not None else 1 << 30 for v in g[1]), g[0].key()))


def describe(place: Place, members: list[ProcView], who: str | None = None) -> str:
    """"ranks 0, 2 wait in all_reduce at train.py:88 for 9.8 s (same stack in every sample)"."""
    who = who or ranks_text(members)
    verb = place.words()
    if len(members) == 1 and verb.startswith("wait"):
        verb = "waits" + verb[4:]
    elif len(members) == 1 and verb.startswith("run "):
        verb = "runs " + verb[4:]
    stuck = all(m.stuck for m in members)
    if stuck:
        span = min(m.same_for_s for m in members)
        return f"{who} {verb}, unchanged for {span:.1f} s (same stack in every sample)"
    if place.kind in ("gone", "unreadable"):
        return f"{who} {verb}"
    moved = ", ".join(f"{m.label}: {m.distinct} stacks in {m.samples} samples" for m in members)
    return f"{who} {verb} at the last sample, moving ({moved})"
