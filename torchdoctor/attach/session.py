"""Collect the attach evidence: stacks sampled a few times, RSS/GPU sampled often, Flight Recorder.

Bounded: ``duration`` seconds of sampling, every call under ``timeout`` in all. Read-only: py-spy
reads memory, psutil and NVML read counters, the Flight Recorder dump is asked for through the
rank's own pipe. No signal is sent to any target. The evidence is a plain dict
(``torchdoctor/rules/attach.py`` judges it; its shape is in docs/attach.md).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from torchdoctor.attach import flight, resources, sampler
from torchdoctor.attach.procs import Target, python_children
from torchdoctor.errors import DoctorError

STACK_SAMPLES = 5  # stack rounds over the window (first and last at its ends)
RESOURCE_INTERVAL_S = 1.0  # RSS / NVML sampling period (one point per second for the trend)
DUMP_TIMEOUT_S = 10.0  # one py-spy dump
GIL_SLACK_S = 10.0  # a GIL record may end this long after its seconds (py-spy start-up on a busy box)


SETTLE_POLL_S = 0.01  # after a dump, the main thread's counters are re-read this often...
SETTLE_READS = 20  # ...until one read equals the last (at most this many: 0.2 s)


def _dump(binary: str, pid: int, timeout: float, nonblocking: bool, native: bool,
          counters=resources.main_thread_counters, sleep=time.sleep) -> dict:
    """One dump with the main thread's wake counters read just before it and once it has
    settled after it. A dump stops and resumes every thread; a thread blocked for good goes back
    to sleep only when it is scheduled again, which on a loaded box can come after the dump has
    returned: read at once, that switch fell into the next window and a rank blocked in a
    collective counted as awake (``bench/attach_wakes.py``, 2-core box, a thread in
    ``Event().wait()`` beside 0/4/8 busy processes: 1, 2 and 4 of 11 windows between dumps had a
    switch; 0 of 11 each with the settle). The settle is added to the dump's ``read_s``, so the
    quiet time between dumps leaves it out too."""
    before = counters(pid)
    d = sampler.dump(binary, pid, timeout, nonblocking, native)
    after = counters(pid)
    if before is not None and after is not None:
        t0 = time.monotonic()
        for _ in range(SETTLE_READS):
            sleep(SETTLE_POLL_S)
            again = counters(pid)
            if again is None or again["switches"] == after["switches"]:
                break
            after = again
        if "read_s" in d:
            d["read_s"] = round(d["read_s"] + time.monotonic() - t0, 3)
        d["main_before"], d["main_after"] = before, after
    return d


def _round(binary: str, pids: list[int], timeout: float, nonblocking: bool, native: bool) -> dict:
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pids)))) as ex:
        futs = {p: ex.submit(_dump, binary, p, timeout, nonblocking, native) for p in pids}
        return {p: f.result() for p, f in futs.items()}


def _first_round_errors(first: dict, targets: list[Target]) -> None:
    """Exit 2 before the window when a target cannot be read at all."""
    for t in targets:
        d = first[t.pid]
        if "error" not in d:
            continue
        if d["kind"] == "permission":
            raise DoctorError(f"not permitted to read the stacks of PID {t.pid} (ptrace): "
                              f"{d['error'].splitlines()[0][:200]}", sampler.PERMISSION_HINT)
        if d["kind"] == "not-python":
            raise DoctorError(f"PID {t.pid} is not a Python process py-spy can read",
                              "give the PID of the training process (with --job: the launcher's PID)")
        if d["kind"] == "gone":
            raise DoctorError(f"PID {t.pid} ended before it could be read", "check the PID with `ps -ef`")
        first_line = next((ln for ln in d["error"].splitlines() if ln.strip()), d["error"])
        raise DoctorError(f"could not read the stacks of PID {t.pid}: {first_line[:200]}",
                          "run py-spy dump --pid PID yourself to see its full message")


class _ResourceLoop(threading.Thread):
    def __init__(self, pids: list[int], gpus: resources.Gpus) -> None:
        super().__init__(daemon=True, name="torchdoctor-attach-resources")
        self.pids, self.gpus = pids, gpus
        self.series: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.series.append(resources.snapshot(self.pids, self.gpus))
            self.stop.wait(RESOURCE_INTERVAL_S)


def collect(targets: list[Target], duration: float, timeout: float, *, nonblocking: bool = False,
            native: bool = False, flight_recorder: bool = True, job: dict | None = None) -> dict:
    binary = sampler.require_pyspy()
    start = time.monotonic()
    deadline = start + max(timeout, 1.0)

    def left() -> float:
        return max(0.5, deadline - time.monotonic())

    procs: dict[int, dict] = {}
    for t in targets:
        procs[t.pid] = {"pid": t.pid, "rank": t.rank, "local_rank": t.local_rank, "role":
                        "rank" if t.rank is not None else "process", "parent": None, "samples": [],
                        "cmdline": " ".join(t.cmdline)[:300]}
        for w in t.workers:
            procs.setdefault(w, {"pid": w, "rank": t.rank, "role": "worker", "parent": t.pid,
                                 "samples": []})
    pids = list(procs)
    first = _round(binary, pids, min(DUMP_TIMEOUT_S, left()), nonblocking, native)
    _first_round_errors(first, targets)
    gpus = resources.Gpus()
    loop = _ResourceLoop(pids, gpus)
    loop.start()
    rounds = [first]
    folder = tempfile.mkdtemp(prefix="torchdoctor-attach-")
    gil = {t.pid: sampler.GilRecord(binary, t.pid, duration, folder) for t in targets}
    completed = False
    try:
        for i in range(1, STACK_SAMPLES):
            due = start + duration * i / (STACK_SAMPLES - 1)
            now = time.monotonic()
            if now >= deadline:
                break
            if due > now:
                time.sleep(min(due, deadline) - now)
            rounds.append(_round(binary, pids, min(DUMP_TIMEOUT_S, left()), nonblocking, native))
        completed = True
    finally:
        loop.stop.set()
        loop.join(timeout=5)
        for pid, rec in gil.items():  # each record ends by itself after its whole seconds
            if completed:
                procs[pid]["gil"] = rec.finish(max(0.5, min(left(), rec.seconds + GIL_SLACK_S)))
            else:  # interrupted (a stop signal, an error): no waiting for the records
                rec.stop()
        shutil.rmtree(folder, ignore_errors=True)
    for r in rounds:
        for p, d in r.items():
            procs[p]["samples"].append(d)
    last = loop.series[-1]["procs"] if loop.series else {}
    for p in pids:
        procs[p]["status"] = last.get(str(p), {}).get("status", "")
    for t in targets:  # workers that appeared during the window are named, not sampled
        procs[t.pid]["workers_at_end"] = python_children(t.pid)
    for p in procs.values():
        p["source"] = _source_lines(p)
    ev = {"duration_s": round(duration, 2), "stack_samples": len(rounds),
          "sampler": {"tool": "py-spy", "version": sampler.version(binary),
                      "blocking": not nonblocking, "native": native},
          "job": job or {}, "processes": list(procs.values()),
          "resources": {"interval_s": RESOURCE_INTERVAL_S, "series": loop.series,
                        "nvml": gpus.available, "nvml_reason": gpus.reason,
                        "host_available": resources.host_available()},
          "flight_recorder": _flight(targets, flight_recorder, left)}
    ev["elapsed_s"] = round(time.monotonic() - start, 2)
    return ev


def _source_lines(proc: dict) -> dict:
    """The text of each main thread's innermost user line in the last sample ("file:line" → text),
    read from the file on disk now (it may have been edited since the job started)."""
    import linecache

    from torchdoctor.attach.views import main_thread, place_of

    for s in reversed(proc.get("samples") or []):
        if "threads" not in s:
            continue
        mt = main_thread(s["threads"], proc["pid"])
        if mt is None:
            return {}
        place = place_of(mt["frames"])
        if not place.file:
            return {}
        return {f"{place.file}:{place.line}": linecache.getline(place.file, place.line).strip()[:200]}
    return {}


def _flight(targets: list[Target], wanted: bool, left) -> dict:
    ranked = [t for t in targets if t.rank is not None]
    if not wanted:
        return {"state": "off", "reason": "--no-flight-recorder"}
    if not ranked:
        return {"state": "not-applicable", "reason": "no rank among the targets"}
    if not all(flight.enabled(t.env, t.rank) for t in ranked):
        return {"state": "not-enabled", "how": flight.HOW_TO_ENABLE}
    per_rank = {}
    for t in ranked:
        if left() <= 0.5:
            per_rank[str(t.rank)] = {"error": "--timeout reached before the dump"}
            continue
        per_rank[str(t.rank)] = flight.trigger_and_read(t.env, t.rank, min(flight.WAIT_S, left()))
    return {"state": "read", "ranks": per_rank}
