"""Attach rules about one process's health, whatever its rank (probe ``attach``).

Pure functions of the evidence ``torchdoctor attach`` collected (``torchdoctor/attach/session.py``);
the rank-level judgments (hangs, waits, livelocks, stuck loader workers) are in
:mod:`torchdoctor.rules.attach`.

- ``host-sync-stall``: every rank stuck in a host sync (``.item()``, ``synchronize``) while NVML
  shows its GPUs idle: the device waits for something that does not come.
- ``gil-held-by-thread``: a thread other than the main (training) thread held the GIL in at least
  ``GIL_MIN_SHARE`` of the GIL samples of the window (py-spy ``record --gil``): the training thread
  waits for the interpreter between its torch calls.
- ``live-memory-growth``: a process's RSS grows over the window (the growth judgment of
  ``memory``, :mod:`torchdoctor.memory.growth`, with seconds for steps).
"""

from __future__ import annotations

from torchdoctor.attach.views import MIN_SAMPLES, last_main_frames, main_thread, ranks_text, sync_call, views
from torchdoctor.catalog import declare
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.memory import growth
from torchdoctor.memory.trend import fit_trend
from torchdoctor.rules.attach import place_text
from torchdoctor.skills import PERFORMANCE, TENSOR_MEMORY

LIVE_MEMORY_GROWTH = declare(
    "live-memory-growth", TENSOR_MEMORY, "warning",
    "a running process's resident memory (RSS) grows steadily over the attach window",
    thresholds={"NOISY_MIN_SLOPE": growth.NOISY_MIN_SLOPE, "GROWTH_MIN_RISE": growth.GROWTH_MIN_RISE,
                "GROWTH_MIN_CONSISTENCY": growth.GROWTH_MIN_CONSISTENCY})

GIL_MIN_SHARE = 0.5  # share of the window's GIL samples a non-main thread held it in
GIL_HELD = declare(
    "gil-held-by-thread", PERFORMANCE, "warning",
    "a thread other than the training thread holds the GIL most of the time in a running process",
    thresholds={"GIL_MIN_SHARE": GIL_MIN_SHARE})

IDLE_UTIL = 10  # percent: a GPU at or under this utilisation over the whole window is idle
HOST_SYNC_STALL = declare(
    "host-sync-stall", PERFORMANCE, "error",
    "every rank waits for its GPU in a host sync (.item(), synchronize) while the GPUs are idle",
    thresholds={"IDLE_UTIL": IDLE_UTIL, "MIN_SAMPLES": MIN_SAMPLES})


def _rss_series(ev: dict, pid: int) -> tuple[list[float], list[float]]:
    ts, ys = [], []
    for snap in (ev.get("resources") or {}).get("series") or []:
        p = (snap.get("procs") or {}).get(str(pid)) or {}
        if isinstance(p.get("rss"), int):
            ts.append(snap["t"])
            ys.append(float(p["rss"]))
    return ts, ys


@rule("live-memory-growth", probes={"attach"}, raises=[LIVE_MEMORY_GROWTH])
def live_memory_growth(ev: dict) -> list[Finding]:
    out, judged = [], 0
    for v in views(ev):
        if v.role == "worker":
            continue
        ts, ys = _rss_series(ev, v.pid)
        if len(ts) < 2:
            continue
        secs = [round(t - ts[0]) for t in ts]  # one second is the "step" of the judgment
        # no warm-up cut: the window opens mid-run (the process warmed up long before), and the
        # default 3-point cut left 7 of the default 10 s window's 10 points, under the fit's 8:
        # the rule could never fire at the default --duration
        fit = fit_trend(secs, ys, warmup=0)
        if fit is None:
            continue
        judged += 1
        room = (ev.get("resources") or {}).get("host_available")
        verdict = growth.judge(fit, noisy=True, room=room if isinstance(room, int) else None,
                               step_s=1.0)
        if not verdict.credible or verdict.severity not in ("warning", "error"):
            continue
        rate = fit.slope  # bytes per second
        out.append(finding(
            "live-memory-growth",
            f"{v.label}: resident memory grows {rate / 2**20:.1f} MiB/s over the {v.window_s:.0f} s "
            f"window ({ys[0] / 2**30:.2f} → {ys[-1] / 2**30:.2f} GiB)",
            {"pid": v.pid, "rank": v.rank, "bytes_per_s": round(rate), "fit": fit.to_dict(),
             "bytes_per_hour": verdict.bytes_per_hour, "horizon": verdict.horizon},
            fix="Run `torchdoctor memory SCRIPT` on the same script to name the lines that keep "
                "memory alive (tensors kept across steps, a growing list of losses, a cache).",
            severity=verdict.severity))
    if not judged:
        raise NotApplicable("too few RSS samples to fit a trend (use a longer --duration)")
    return out


def _gpu_utils(ev: dict, pid: int) -> list[float]:
    out = []
    for snap in (ev.get("resources") or {}).get("series") or []:
        for g in ((snap.get("procs") or {}).get(str(pid)) or {}).get("gpu") or []:
            if isinstance(g.get("util"), (int, float)):
                out.append(float(g["util"]))
    return out


@rule("host-sync-stall", probes={"attach"}, raises=[HOST_SYNC_STALL])
def host_sync_stall(ev: dict) -> list[Finding]:
    if not (ev.get("resources") or {}).get("nvml"):
        raise NotApplicable("needs NVML (an NVIDIA driver) to tell a host waiting on an idle GPU "
                            "from one waiting on a busy GPU")
    procs = [p for p in ev.get("processes") or [] if p.get("role") != "worker"]
    by_pid = {v.pid: v for v in views(ev)}
    stalled = []
    for p in procs:
        v = by_pid[int(p["pid"])]
        src = (p.get("source") or {}).get(f"{v.place.file}:{v.place.line}", "")
        call = sync_call(last_main_frames(p), src) if v.stuck else None
        if call is None:
            return []
        util = _gpu_utils(ev, v.pid)
        if not util:
            raise NotApplicable(f"{v.label} holds no GPU memory that NVML reports")
        if max(util) > IDLE_UTIL:
            return []  # the GPU works: a long kernel, slow not stuck
        stalled.append((v, call, max(util), src))
    if not stalled:
        return []
    v0, call, _, src = stalled[0]
    who = ranks_text([v for v, *_ in stalled])
    top = max(u for _, _, u, _ in stalled)
    return [finding(
        "host-sync-stall",
        f"{who} wait{'s' if len(stalled) == 1 else ''} for the GPU in {call} at {v0.place.at}, "
        f"unchanged for {min(v.same_for_s for v, *_ in stalled):.1f} s, while the GPUs are idle "
        f"(utilisation at most {top:g}% over the window)",
        {**{v.label: f"{place_text(v)}: {s}" for v, _, _, s in stalled}},
        fix="The host waits for device work that never runs: a collective kernel waiting for a peer "
            "(a rank on another node: attach there too), a stream waiting on an event never recorded, "
            "or a hung device (nvidia-smi, dmesg for Xid errors). `--native` shows the CUDA call; "
            "NCCL_DEBUG=INFO and the Flight Recorder name the collective.")]


JOIN_FRAMES = ("Thread.join", "Thread._wait_for_tstate_lock")


def _main_only_joins(proc: dict) -> bool:
    """The main thread waited in Thread.join in every stack sample: the work runs in another
    thread by design (that thread is the training thread, not a bystander)."""
    seen = 0
    for s in proc.get("samples") or []:
        if "threads" not in s:
            continue
        mt = main_thread(s["threads"], int(proc["pid"]))
        if mt is None or not any(f["name"] in JOIN_FRAMES for f in mt["frames"]):
            return False
        seen += 1
    return seen > 0


@rule("gil-held-by-thread", probes={"attach"}, raises=[GIL_HELD])
def gil_held_by_thread(ev: dict) -> list[Finding]:
    out, judged = [], 0
    for p, v in zip(ev.get("processes") or [], views(ev)):
        gil = p.get("gil") or {}
        if v.role == "worker" or "threads" not in gil:
            continue
        expected = gil["rate_hz"] * gil["seconds"]
        if expected <= 0:
            continue
        judged += 1
        if _main_only_joins(p):
            continue
        main = {t.get("tid") for s in p.get("samples") or [] for t in s.get("threads") or []
                if t.get("name") == "MainThread"} | {v.pid}
        main_held = sum(t["samples"] for t in gil["threads"] if t["tid"] in main or t["name"] == "MainThread")
        for t in gil["threads"]:
            if t["tid"] in main or t["name"] == "MainThread":
                continue
            share = t["samples"] / expected
            if share < GIL_MIN_SHARE:
                continue
            name = f"thread {t['name']!r} (tid {t['tid']})" if t["name"] else f"thread tid {t['tid']}"
            out.append(finding(
                "gil-held-by-thread",
                f"{v.label}: {name} held the GIL in {share:.0%} of {expected} samples over "
                f"{gil['seconds']} s, mostly in {t['top']}; the main thread held it in "
                f"{main_held / expected:.0%}",
                {"pid": v.pid, "rank": v.rank, "thread": t["name"], "tid": t["tid"],
                 "gil_samples": t["samples"], "expected_samples": expected,
                 "rate_hz": gil["rate_hz"], "seconds": gil["seconds"], "where": t["top"],
                 "where_samples": t["top_samples"], "main_thread_gil_samples": main_held,
                 "main_thread": place_text(v)},
                fix="Python runs one thread at a time: while that thread holds the GIL the training "
                    "loop waits between its torch calls. Move its work to a process "
                    "(multiprocessing, a DataLoader worker), make it sleep between rounds, or do it "
                    "in fewer, larger vectorised calls that release the GIL (torch, numpy)."))
    if not judged:
        raise NotApplicable("no GIL samples (py-spy record did not run)")
    return out
