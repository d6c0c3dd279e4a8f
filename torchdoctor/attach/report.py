"""The attach Report: evidence judged by the rules of probe ``attach``, with the metrics the
console section and the JSON show (where each process is, its resources, the Flight Recorder)."""

from __future__ import annotations

import platform

from torchdoctor.attach import views as V

MAX_FRAMES = 40  # frames kept per thread in the report's last-sample stacks


def _last_stacks(proc: dict) -> list[dict]:
    for s in reversed(proc.get("samples") or []):
        if "threads" in s:
            return [{"thread": t.get("name") or str(t.get("tid")), "active": t.get("active"),
                     "gil": t.get("gil"),
                     "frames": [f"{f['file']}:{f['line']} {f['name']}" for f in t["frames"][:MAX_FRAMES]]}
                    for t in s["threads"]]
    return []


def _resources(ev: dict, pid: int) -> dict:
    rss, util, gmem = [], [], []
    for snap in (ev.get("resources") or {}).get("series") or []:
        p = (snap.get("procs") or {}).get(str(pid)) or {}
        if isinstance(p.get("rss"), int):
            rss.append(p["rss"])
        for g in p.get("gpu") or []:
            if isinstance(g.get("util"), (int, float)):
                util.append(g["util"])
            if isinstance(g.get("mem"), int):
                gmem.append(g["mem"])
    out: dict = {}
    if rss:
        out.update(rss_first=rss[0], rss_last=rss[-1], rss_max=max(rss), rss_samples=len(rss))
    if util:
        out.update(gpu_util_mean=round(sum(util) / len(util), 1), gpu_util_max=max(util))
    if gmem:
        out.update(gpu_mem_last=gmem[-1], gpu_mem_max=max(gmem))
    return out


def metrics(ev: dict) -> dict:
    vs = V.views(ev)
    procs = []
    for p, v in zip(ev.get("processes") or [], vs):
        reads = [s.get("read_s") for s in p.get("samples") or [] if isinstance(s.get("read_s"), float)]
        errors = [s["error"][:200] for s in p.get("samples") or [] if "error" in s]
        gil = p.get("gil") or {}
        procs.append({**v.to_dict(), **_resources(ev, v.pid),
                      "gil": ({"rate_hz": gil["rate_hz"], "seconds": gil["seconds"],
                               "threads": gil["threads"][:8]} if "threads" in gil
                              else {"error": str(gil.get("error", ""))[:200]} if gil else None),
                      "read_s_max": max(reads) if reads else None,
                      "errors": errors[:3], "stacks": _last_stacks(p)})
    res = ev.get("resources") or {}
    return {"where": [V.describe(place, members) for place, members in V.groups(vs)],
            "workers": [V.worker_text(v) for v in vs if v.role == "worker"],
            "processes": procs, "duration_s": ev.get("duration_s"), "elapsed_s": ev.get("elapsed_s"),
            "stack_samples": ev.get("stack_samples"), "sampler": ev.get("sampler"),
            "job": ev.get("job"), "nvml": res.get("nvml"), "nvml_reason": res.get("nvml_reason"),
            "flight_recorder": ev.get("flight_recorder")}


def build_report(ev: dict, target: str):
    from torchdoctor.findings import Report
    from torchdoctor.judge import judge

    sampler = ev.get("sampler") or {}
    report = Report(command="attach", target=target, metrics={"attach": metrics(ev)},
                    context={"python": platform.python_version(), "host": platform.node(),
                             "sampler": f"{sampler.get('tool', '?')} {sampler.get('version', '')}".strip()})
    judge("attach", ev, report)
    return report
