"""Step-clock rules: dataloader-bound, model-moved-in-loop, cpu-oversubscribed.

Thresholds (why: docs/findings/<code>.md, "How it is measured"):
* dataloader-bound: data wait ≥ 30% of the judged steps' wall time (FINDINGS.md), at least
  MIN_STEPS judged steps; on CUDA also the GPU busy estimate ≤ 75% (a host that waits for
  data while the GPU still works through queued kernels is not data-bound). The finding names
  the loader that fed the judged steps (``data_step``/``data_loader`` evidence: the loader of
  each step's last batch), unless another loader (an evaluation loop) waited longer.
* model-moved-in-loop: a module moved in ≥ 50% of the judged steps (≥ MIN_STEPS of them).
  Warning when the moves really copy or cost ≥ 1% of the step; info for no-op repeats.
* cpu-oversubscribed: intra-op threads × local processes > usable cores; or, CPU-only, the
  neighbours used ≥ 1 core while the main thread got < 50% of the non-data-wait wall time.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.probes.steps import device_summary, judged_steps
from torchdoctor.rules import NotApplicable, rule
from torchdoctor.runner.frames import short_path

MIN_STEPS = 3
DATA_SHARE = 0.30
GPU_BUSY_MAX = 0.75
MOVE_STEP_FRACTION = 0.5
MOVE_COST_SHARE = 0.01
RUNQUEUE_WAIT_SHARE = 0.3  # of the threads' runnable time spent waiting for a CPU
MIN_CPU_S = 0.05  # below this much CPU work the run is not CPU-bound enough to judge
OTHER_LOAD_CORES = 1.0


def _need_steps(ev: Evidence) -> list[dict[str, Any]]:
    steps = judged_steps(ev)
    if len(steps) < MIN_STEPS:
        raise NotApplicable(f"needs {MIN_STEPS} training steps after warm-up, saw {len(steps)}")
    return steps


def _short(path: str | None) -> str | None:
    return short_path(path)


@rule("dataloader-bound", probes={"checkup", "profile"})
def dataloader_bound(ev: Evidence) -> list[Finding]:
    steps = _need_steps(ev)
    if not any(int(s.get("batches", 0)) for s in steps):
        raise NotApplicable("the steps took no batch from a torch DataLoader")
    wall = sum(float(s["wall_s"]) for s in steps)
    data = sum(float(s["data_s"]) for s in steps)
    share = data / wall if wall > 0 else 0.0
    dev = device_summary(ev)
    busy = dev.get("busy") if dev else None
    if share < DATA_SHARE or (busy is not None and busy > GPU_BUSY_MAX):
        return []
    loader, by_loader = _feeding_loader(ev, steps)
    env = ev.last("env") or {}
    workers = loader.get("num_workers")
    cpus = env.get("cpus")
    ev_out: dict[str, Any] = {
        "data_wait_share": round(share, 3),
        "data_wait_ms_per_step": round(data / len(steps) * 1e3, 3),
        "step_ms": round(wall / len(steps) * 1e3, 3),
        "steps_judged": len(steps),
        "num_workers": workers,
        "pin_memory": loader.get("pin_memory"),
        "batch_size": loader.get("batch_size"),
        "cpu_count": cpus,
    }
    if busy is not None:
        ev_out["gpu_busy_at_most"] = busy
    if len(by_loader) > 1:
        ev_out["data_wait_ms_per_step_by_loader"] = by_loader
    if loader.get("created_at"):
        ev_out["loader_built_at"] = _short(loader["created_at"])
    if loader.get("loop"):
        ev_out["loop"] = _short(loader["loop"])
    getitem = loader.get("getitem")
    ds = loader.get("dataset")
    if workers == 0:
        ev_out["slowest_stage"] = (f"{ds}.__getitem__ + collate, in the main process"
                                   + (f" ({_short(getitem)})" if getitem else ""))
    else:
        ev_out["slowest_stage"] = (f"{workers} worker processes do not keep up; each runs "
                                   f"{ds}.__getitem__" + (f" ({_short(getitem)})" if getitem else ""))
    fixes = []
    if workers == 0:
        n = max(2, min(8, (cpus or 2)))
        fixes.append(f"Load in parallel: DataLoader(num_workers={n}, persistent_workers=True)")
    elif cpus and workers is not None and workers < cpus:
        fixes.append(f"More workers: num_workers={min(cpus, max(workers * 2, workers + 2))} "
                     f"(of {cpus} CPUs)")
    fixes.append(f"Make {ds}.__getitem__ cheaper: decode/augment less per sample, pre-process "
                 "once and cache, or move augmentation to the GPU")
    if busy is not None and not loader.get("pin_memory"):
        fixes.append("pin_memory=True with .to(device, non_blocking=True)")
    where = ev_out.get("loop") or _short(getitem) or ""
    title = (f"the loop waits for data {share:.0%} of each step "
             f"({ev_out['data_wait_ms_per_step']:.3g} of {ev_out['step_ms']:.3g} ms)"
             + (f" at {where}" if where else ""))
    return [finding("dataloader-bound", title, ev_out, fix="; ".join(fixes))]


def _feeding_loader(ev: Evidence, steps: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    """The facts of the loader whose batches fed the judged steps, and the wait per loader.

    The loader that delivered the last batch before most judged steps' optimizer step fed
    them; if another loader waited longer over those steps (a slow evaluation loader), that
    one is named instead. Without per-loader evidence: the last iterator described.
    """
    per_step = {e.get("step"): e for e in ev.of("data_step")}
    rows = [per_step[s["step"]] for s in steps if s.get("step") in per_step]
    facts = {e.get("loader"): e for e in ev.of("data_loader")}
    if not rows or not facts:
        return ev.last("dataloader") or {}, {}
    fed: dict[int, int] = {}
    wait: dict[int, float] = {}
    for r in rows:
        if r.get("fed") is not None:
            fed[int(r["fed"])] = fed.get(int(r["fed"]), 0) + 1
        for k, v in (r.get("wait_s") or {}).items():
            wait[int(k)] = wait.get(int(k), 0.0) + float(v)
    if not wait:
        return ev.last("dataloader") or {}, {}
    pick = max(fed, key=fed.get) if fed else max(wait, key=wait.get)
    if wait.get(pick, 0.0) < 0.5 * sum(wait.values()):
        pick = max(wait, key=wait.get)
    n = len(steps)
    by_loader = {}
    for k, v in sorted(wait.items(), key=lambda kv: -kv[1]):
        f = facts.get(k) or {}
        label = _short(f.get("loop") or f.get("created_at")) or f"loader #{k}"
        by_loader[label] = round(v / n * 1e3, 3)
    return facts.get(pick) or ev.last("dataloader") or {}, by_loader


@rule("model-moved-in-loop", probes={"checkup", "profile"})
def model_moved_in_loop(ev: Evidence) -> list[Finding]:
    steps = _need_steps(ev)
    first = int(steps[0]["step"])
    moves = [m for m in ev.of("module_moves") if int(m.get("step", 0)) >= first]
    if not ev.has("module_moves_summary") and not moves:
        raise NotApplicable("module moves were not instrumented in this run")
    frac = len(moves) / len(steps)
    if frac < MOVE_STEP_FRACTION or len(moves) < MIN_STEPS:
        return []
    real = sum(int(m.get("real", 0)) for m in moves)
    calls = sum(int(m.get("calls", 0)) for m in moves)
    t = sum(float(m.get("time_s", 0.0)) for m in moves)
    wall = sum(float(s["wall_s"]) for s in steps)
    cost = t / wall if wall > 0 else 0.0
    site = next((m.get("site") for m in moves if m.get("site")), None)
    module = next((m.get("module") for m in moves if m.get("module")), None)
    ev_out = {
        "steps_with_moves": f"{len(moves)} of {len(steps)}",
        "calls_per_step": round(calls / len(moves), 2),
        "real_copies": real,
        "time_in_moves_share": round(cost, 4),
        "module": module,
        "site": _short(site),
    }
    severity = "warning" if (real or cost >= MOVE_COST_SHARE) else "info"
    what = "copies its weights" if real else "is re-moved (a no-op that walks every parameter)"
    title = (f"{module or 'a module'} {what} in {len(moves)} of {len(steps)} steps"
             + (f" at {_short(site)}" if site else ""))
    return [finding("model-moved-in-loop", title, ev_out, severity=severity,
                    fix="Move the model once, before the training loop; inside the loop move "
                        "only the batch (x = x.to(device, non_blocking=True))")]


@rule("cpu-oversubscribed", probes={"checkup", "profile"})
def cpu_oversubscribed(ev: Evidence) -> list[Finding]:
    cpu = ev.last("cpu")
    if not cpu:
        raise NotApplicable("CPU usage was not measured in this run")
    threads = cpu.get("torch_threads") or 1
    procs = cpu.get("local_processes") or 1
    cores = cpu.get("cores") or 1
    ev_out: dict[str, Any] = {"torch_threads": threads, "processes": procs, "usable_cores": cores,
                              "affinity_cpus": cpu.get("affinity"),
                              "cgroup_quota_cpus": cpu.get("cgroup_quota")}
    if threads * procs > cores:
        ev_out["loadavg_1m"] = cpu.get("loadavg_1m")
        return [finding(
            "cpu-oversubscribed",
            f"{threads} intra-op threads × {procs} process(es) on {cores} usable cores",
            ev_out,
            fix=f"torch.set_num_threads({max(1, cores // procs)}) (or OMP_NUM_THREADS="
                f"{max(1, cores // procs)}) so threads × processes ≤ usable cores")]
    if ev.has("step_device"):
        return []  # on GPU the main thread legitimately waits; the load check is CPU-only
    if cpu.get("threads_runqueue_wait_s") is None or cpu.get("other_load_cores") is None:
        raise NotApplicable("needs a few training steps and /proc schedstat to measure CPU waits")
    first, last = cpu.get("window_steps", [0, 0])
    steps = [s for s in ev.of("step") if first <= int(s["step"]) <= last]
    if len(steps) < MIN_STEPS:
        raise NotApplicable("too few steps to measure CPU waits")
    run_s, wait_s = float(cpu["threads_on_cpu_s"]), float(cpu["threads_runqueue_wait_s"])
    other = float(cpu["other_load_cores"])
    wait_share = wait_s / (run_s + wait_s) if run_s + wait_s > 0 else 0.0
    if run_s < MIN_CPU_S or wait_share < RUNQUEUE_WAIT_SHARE or other < OTHER_LOAD_CORES:
        return []
    ev_out.update(runqueue_wait_share=round(wait_share, 3), threads_on_cpu_s=run_s,
                  threads_runqueue_wait_s=wait_s, other_processes_cores=other,
                  host_busy_cores=cpu.get("host_busy_cores"), loadavg_1m=cpu.get("loadavg_1m"))
    return [finding(
        "cpu-oversubscribed",
        f"the host is loaded: other processes used {other:.1f} of {cpu.get('logical_cpus')} "
        f"CPUs and the training threads waited for a CPU {wait_share:.0%} of the time they "
        f"were ready to run",
        ev_out,
        fix="Run on an idle machine or pin the job to free cores (taskset), and lower "
            "torch.set_num_threads so the job and its neighbours fit the cores")]
