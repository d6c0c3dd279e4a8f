"""Step-clock rules: dataloader-bound, model-moved-in-loop, cpu-oversubscribed.

How they decide (the thresholds are the constants declared with each code below; why these
values: docs/findings/<code>.md, "How it is measured"):
* dataloader-bound: data wait ≥ DATA_SHARE of the judged steps' wall time, at least
  MIN_STEPS judged steps; on CUDA also the GPU busy estimate ≤ GPU_BUSY_MAX (a host that
  waits for data while the GPU still works through queued kernels is not data-bound). The
  finding names the loader that fed the judged steps (``data_step``/``data_loader`` evidence:
  the loader of each step's last batch), and the share counts that loader's wait only (an
  evaluation loop's loader, iterated between two training steps, is listed, not counted). The
  median step's share is given beside the mean; when a few steps hold half the wait (epoch
  starts, :func:`concentrated_wait`) and the median step is under DATA_SHARE, the finding is
  info.
* model-moved-in-loop: a module moved in ≥ MOVE_STEP_FRACTION of the judged steps (≥
  MIN_STEPS of them). Warning when the moves really copy or cost ≥ MOVE_COST_SHARE of the
  step; info for no-op repeats.
* cpu-oversubscribed: intra-op threads × local processes > usable cores; or, CPU-only, the
  neighbours used ≥ OTHER_LOAD_CORES cores while the training threads (≥ MIN_CPU_S of CPU
  work) waited for a CPU ≥ RUNQUEUE_WAIT_SHARE of the time they were runnable.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.evidence.steps import device_summary, judged_steps
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import PERFORMANCE

MIN_STEPS = 3
DATA_SHARE = 0.30
GPU_BUSY_MAX = 0.75
MOVE_STEP_FRACTION = 0.5
MOVE_COST_SHARE = 0.01
RUNQUEUE_WAIT_SHARE = 0.3  # of the threads' runnable time spent waiting for a CPU
MIN_CPU_S = 0.05  # below this much CPU work the run is not CPU-bound enough to judge
OTHER_LOAD_CORES = 1.0
FEW_SHARE = 0.5  # "a few steps hold the wait": the fewest steps holding half the wait ...
FEW_FRACTION = 0.1  # ... are at most this share of the judged steps
MIN_STEPS_FOR_FEW = 10

DATALOADER_BOUND = declare(
    "dataloader-bound", PERFORMANCE, "error",
    f"the loop waits on the next batch for >= {DATA_SHARE:.0%} of step time",
    thresholds={"DATA_SHARE": DATA_SHARE, "MIN_STEPS": MIN_STEPS, "GPU_BUSY_MAX": GPU_BUSY_MAX,
                "FEW_SHARE": FEW_SHARE, "FEW_FRACTION": FEW_FRACTION,
                "MIN_STEPS_FOR_FEW": MIN_STEPS_FOR_FEW})
MODEL_MOVED_IN_LOOP = declare(
    "model-moved-in-loop", PERFORMANCE, "warning",
    "a module is moved with .to()/.cuda() every step",
    thresholds={"MOVE_STEP_FRACTION": MOVE_STEP_FRACTION, "MIN_STEPS": MIN_STEPS,
                "MOVE_COST_SHARE": MOVE_COST_SHARE})
CPU_OVERSUBSCRIBED = declare(
    "cpu-oversubscribed", PERFORMANCE, "warning",
    "intra-op threads x processes exceed the CPU cores available, or the host is loaded",
    thresholds={"OTHER_LOAD_CORES": OTHER_LOAD_CORES, "MIN_CPU_S": MIN_CPU_S,
                "RUNQUEUE_WAIT_SHARE": RUNQUEUE_WAIT_SHARE, "MIN_STEPS": MIN_STEPS})


def _need_steps(ev: Evidence) -> list[dict[str, Any]]:
    steps = judged_steps(ev)
    if len(steps) < MIN_STEPS:
        raise NotApplicable(f"needs {MIN_STEPS} training steps after warm-up, saw {len(steps)}")
    return steps


def _short(path: str | None) -> str | None:
    return short_path(path)


@rule("dataloader-bound", probes={"checkup", "profile"},
      needs={"step", "step_device", "env", "data_step", "data_loader", "dataloader"},
      raises=[DATALOADER_BOUND])
def dataloader_bound(ev: Evidence) -> list[Finding]:
    steps = _need_steps(ev)
    if not any(int(s.get("batches", 0)) for s in steps):
        raise NotApplicable("the steps took no batch from a torch DataLoader")
    loader, by_loader, fed_wait, starts = _feeding_loader(ev, steps)
    walls = [float(s["wall_s"]) for s in steps]
    wall = sum(walls)
    data = sum(fed_wait)
    share = data / wall if wall > 0 else 0.0
    dev = device_summary(ev)
    busy = dev.get("busy") if dev else None
    if share < DATA_SHARE or (busy is not None and busy > GPU_BUSY_MAX):
        return []
    median_share = statistics.median(w_ / t for w_, t in zip(fed_wait, walls) if t > 0)
    env = ev.last("env") or {}
    workers = loader.get("num_workers")
    cpus = env.get("cpus")
    ev_out: dict[str, Any] = {
        "data_wait_share": round(share, 3),
        "median_step_data_wait_share": round(median_share, 3),
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
        ev_out["share_counts"] = "the training loader's wait only (other loaders' wait is listed, not counted)"
    few = concentrated_wait(fed_wait, [int(s["step"]) for s in steps], starts)
    if few:
        ev_out["wait_concentrated"] = few["text"]
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
    spiky = few is not None and median_share < DATA_SHARE
    if spiky and few.get("epoch_start") and workers:
        fixes.append("Keep the workers between epochs: DataLoader(..., persistent_workers=True), "
                     "and a larger prefetch_factor")
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
    severity = None
    if spiky:  # the typical step is not data-bound: a few steps hold the wait
        title = (f"the loop waits for data {share:.0%} of its step time, but the median step only "
                 f"{median_share:.0%}: {few['text']}" + (f" at {where}" if where else ""))
        severity = "info"
    elif few:
        title += f" (median step {median_share:.0%}; {few['text']})"
    return [finding("dataloader-bound", title, ev_out, fix="; ".join(fixes), severity=severity)]


def concentrated_wait(waits: list[float], numbers: list[int],
                      starts: set[int] | None = None) -> dict[str, Any] | None:
    """When a few steps hold most of the data wait: {"text", "steps", "epoch_start"}, else None.

    "A few": the fewest steps that hold ≥ FEW_SHARE of the wait number at most FEW_FRACTION of
    the judged steps (and MIN_STEPS_FOR_FEW steps were judged). ``starts``: step numbers in
    which the training loader's iterator began (an epoch start: workers spin up, the first
    batches are loaded before any arrives).
    """
    total = sum(waits)
    n = len(waits)
    if n < MIN_STEPS_FOR_FEW or total <= 0:
        return None
    order = sorted(range(n), key=lambda i: -waits[i])
    held, k = 0.0, 0
    while held < FEW_SHARE * total:
        held += waits[order[k]]
        k += 1
    if k > max(1, int(FEW_FRACTION * n)):
        return None
    top = sorted(numbers[i] for i in order[:k])
    at_start = [x for x in top if starts and x in starts]
    text = (f"{k} step{'s' if k > 1 else ''} of {n} hold {held / total:.0%} of the wait "
            f"(step{'s' if k > 1 else ''} {', '.join(map(str, top[:5]))}{'…' if k > 5 else ''})")
    if at_start:
        text += f"; {len(at_start)} of them began an epoch: the loader's iterator (workers) started there"
    return {"text": text, "steps": top, "epoch_start": bool(at_start)}


def _feeding_loader(ev: Evidence, steps: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any], dict[str, float], list[float], set[int]]:
    """The loader that fed the judged steps: its facts, the wait per loader, its wait per step,
    and the steps in which its iterator began.

    The loader that delivered the last batch before most judged steps' optimizer step fed
    them (a validation loader iterated between two training steps did not). Its wait per step
    is what ``dataloader-bound`` counts; other loaders' waits are only listed. Without
    per-loader evidence: the last iterator described, and each step's whole data wait.
    """
    per_step = {e.get("step"): e for e in ev.of("data_step")}
    rows = [per_step.get(s["step"]) for s in steps]
    facts = {e.get("loader"): e for e in ev.of("data_loader")}
    whole = [float(s["data_s"]) for s in steps]
    if not any(rows) or not facts:
        return ev.last("dataloader") or {}, {}, whole, set()
    fed: dict[int, int] = {}
    wait: dict[int, float] = {}
    for r in rows:
        if not r:
            continue
        if r.get("fed") is not None:
            fed[int(r["fed"])] = fed.get(int(r["fed"]), 0) + 1
        for k, v in (r.get("wait_s") or {}).items():
            wait[int(k)] = wait.get(int(k), 0.0) + float(v)
    if not wait:
        return ev.last("dataloader") or {}, {}, whole, set()
    pick = max(fed, key=fed.get) if fed else max(wait, key=wait.get)
    n = len(steps)
    by_loader = {}
    for k, v in sorted(wait.items(), key=lambda kv: -kv[1]):
        f = facts.get(k) or {}
        label = _short(f.get("loop") or f.get("created_at")) or f"loader #{k}"
        by_loader[label] = round(v / n * 1e3, 3)
    fed_wait = [float((r.get("wait_s") or {}).get(str(pick), 0.0)) if r else d
                for r, d in zip(rows, whole)]
    starts = {int(s["step"]) for s, r in zip(steps, rows)
              if r and str(pick) in (r.get("starts") or ())}
    return facts.get(pick) or ev.last("dataloader") or {}, by_loader, fed_wait, starts


@rule("model-moved-in-loop", probes={"checkup", "profile"},
      needs={"step", "module_moves", "module_moves_summary"}, raises=[MODEL_MOVED_IN_LOOP])
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


@rule("cpu-oversubscribed", probes={"checkup", "profile"}, needs={"cpu", "step", "step_device"},
      raises=[CPU_OVERSUBSCRIBED])
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
