"""Rules about the run itself (every script probe): hang, death by signal, no training steps."""

from __future__ import annotations

import linecache
import statistics
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import rule
from torchdoctor.runner.frames import is_user_file, short_path
from torchdoctor.skills import DEBUGGING

# A timed-out run is "hung" when nothing progressed for the last STALL_FRACTION of the
# timeout, and for at least STALL_STEPS median step times, and at least STALL_MIN_S.
STALL_FRACTION = 0.10
STALL_STEPS = 5
STALL_MIN_S = 1.0

# raised by the guarded judge (torchdoctor/judge.py) and the pipeline, for every family
INTERNAL_ERROR = declare("internal-error", DEBUGGING, "warning",
                         "a torchdoctor probe or rule failed; the rest of the report still stands")
SCRIPT_HUNG = declare("script-hung", DEBUGGING, "error",
                      "no progress until the timeout: every thread's stack, the user frame it waited in",
                      thresholds={"STALL_FRACTION": STALL_FRACTION, "STALL_STEPS": STALL_STEPS,
                                  "STALL_MIN_S": STALL_MIN_S})
KILLED_BY_SIGNAL = declare("killed-by-signal", DEBUGGING, "error",
                           "the script died by a signal (SIGKILL is often the host OOM killer)")
NO_TRAINING_STEPS = declare("no-training-steps", DEBUGGING, "warning",
                            "no optimizer step or backward was seen, so step-based rules could not judge")
SIGNAL_HINTS = {
    "SIGKILL": "SIGKILL without a timeout usually comes from the host's out-of-memory killer "
               "(check `dmesg | grep -i oom`) or from a job scheduler",
    "SIGSEGV": "a segmentation fault in native code (a C/CUDA extension, a library version "
               "mismatch, or a DataLoader worker sharing memory badly)",
    "SIGABRT": "native code aborted (a failed assertion in C++/CUDA code, often with a "
               "message just above in the output; gloo aborts on collective mismatches)",
    "SIGBUS": "a bus error: often shared memory (/dev/shm) too small for DataLoader workers",
    "SIGTERM": "terminated by another process (scheduler pre-emption, a time limit)",
    "SIGILL": "an illegal instruction: a binary built for another CPU",
}


_OWN_THREADS = ("runner/rundir.py", "runner/lifeline.py")


def _stacks(ev: Evidence) -> dict[str, Any]:
    from torchdoctor.runner.rundir import STACKS
    from torchdoctor.runner.stacks import read_stacks

    if ev.run_dir is None:
        return {"threads": [], "fatal": None}
    return read_stacks(ev.run_dir / STACKS)


def _fmt(frame: list) -> str:
    return f"{short_path(f'{frame[0]}:{frame[1]}')} in {frame[2]}"


def _user_frames(frames: list[list]) -> list[list]:
    return [f for f in frames if is_user_file(f[0])]


def stack_evidence(stacks: dict[str, Any]) -> dict[str, Any]:
    """Where the script's main thread was (innermost user frame), plus the other threads."""
    from torchdoctor.runner.stacks import main_thread

    threads = stacks.get("threads") or []
    main = main_thread(threads)
    out: dict[str, Any] = {}
    if main is None:
        return out
    frames = [f for f in main["frames"] if not f[0].endswith(("runner/harness.py", "runpy.py"))
              and not f[0].startswith(("<frozen runpy", "<string>"))]
    user = _user_frames(frames)
    if user:
        f = user[0]
        out["stuck_at"] = _fmt(f)
        code = linecache.getline(f[0], f[1]).strip()
        if code:
            out["code"] = code
    if frames:
        out["waiting_in"] = _fmt(frames[0])
    out["main_thread"] = [_fmt(f) for f in frames[:12]]
    others = []
    for t in threads:
        if t is main:
            continue
        uf = _user_frames(t["frames"])
        if not uf and any(f[0].endswith(_OWN_THREADS) for f in t["frames"]):
            continue  # torchdoctor's own threads (evidence flusher, lifeline): not the script's
        top = uf[0] if uf else (t["frames"][0] if t["frames"] else None)
        if top:
            others.append(_fmt(top))
    if others:
        out["other_threads"] = others[:8]
    return out


def _hang_fix(stack: dict[str, Any]) -> str:
    frames = " ".join(stack.get("main_thread", []))
    if "dataloader" not in frames and any(j in frames for j in _JOINS):
        return ("The main process waits for processes it started (Process.join, "
                "torch.multiprocessing.spawn), which torchdoctor does not follow: run their "
                "function in the launched process, or start DDP ranks with torchrun "
                "(`torchdoctor dist --nproc-per-node N`), to see where they stop")
    if "dataloader" in frames or "multiprocessing" in frames or "queues.py" in frames:
        return ("The main process waits for a DataLoader worker: run once with num_workers=0 "
                "to see the worker's own error or deadlock; set DataLoader(timeout=...) so a "
                "stuck worker raises")
    if "distributed" in frames:
        return ("The process waits in a collective: another rank skipped it or died; run "
                "`torchdoctor dist` and compare the ranks' stacks")
    return ("Look at the line it was stuck on: a wait without timeout (queue.get, lock, "
            "barrier, input(), an endless loop); add a timeout or fix the exit condition")


@rule("script-hung", probes={"run"}, needs={"step", "script_start", "process_started"},
      raises=[SCRIPT_HUNG])
def script_hung(ev: Evidence) -> list[Finding]:
    res = ev.result
    if res.get("outcome") != "timeout":
        return []  # it ended on its own: not hung
    timeout = float(res.get("timeout_s") or ev.options.get("timeout") or 0)
    steps = ev.of("step")
    start = ev.last("script_start") or {}
    t_start = float(start.get("t", 0.0))
    # event times count from the harness's start, a fraction of a second after the launch
    # the timeout counts from: the kill came at about t = timeout on that clock
    last_t = max([float(e.get("t", 0.0)) for e in ev.events] + [t_start])
    t_end = max(last_t, timeout)
    last_progress = float(steps[-1]["t"]) if steps else t_start
    stalled = t_end - last_progress
    walls = [float(s.get("wall_s", 0.0)) for s in steps]
    med = statistics.median(walls) if walls else 0.0
    need = max(STALL_FRACTION * timeout, STALL_STEPS * med, STALL_MIN_S)
    if steps and stalled < need:  # still stepping, slowly, when it was killed: say so
        return [_killed_while_stepping(ev, timeout, len(steps), stalled, med)]
    if not steps and script_processes(ev) and waits_on_own_processes(ev):
        return []  # it waited for the processes it started: no-training-steps says so
    stack = stack_evidence(_stacks(ev))
    where = stack.get("stuck_at") or stack.get("waiting_in") or "an unknown place"
    what = f"after step {len(steps)}" if steps else "before the first training step"
    evidence: dict[str, Any] = {
        "timeout_s": timeout,
        "steps_done": len(steps),
        "no_progress_s": round(stalled, 1),
        **stack,
    }
    if ev.run_dir is not None:
        evidence["stacks_file"] = "stacks.txt (every thread, at the timeout)"
    return [finding("script-hung",
                    f"no progress for {stalled:.0f} s {what}, stopped at the {timeout:g} s "
                    f"timeout; stuck at {where}", evidence, fix=_hang_fix(stack))]


def _killed_while_stepping(ev: Evidence, timeout: float, steps: int, stalled: float,
                           median_step_s: float) -> Finding:
    """Killed at the timeout although steps still ended not long before: it did not stop at a
    step boundary within the grace after torchdoctor's clean-stop request (a step longer than
    the grace, or the script swallowed the stop), or no step ended in the parent's window."""
    res = ev.result
    grace = float(res.get("clean_stop_grace_s") or 0.0)
    stack = stack_evidence(_stacks(ev))
    where = stack.get("stuck_at") or stack.get("waiting_in") or "an unknown place"
    evidence: dict[str, Any] = {"timeout_s": timeout, "steps_done": steps,
                                "last_step_before_kill_s": round(stalled, 1),
                                "median_step_s": round(median_step_s, 3), **stack}
    if res.get("clean_stop_requested"):
        evidence["clean_stop_grace_s"] = grace
        what = (f"did not stop at a step boundary within {grace:g} s of torchdoctor's clean-stop "
                f"request")
    else:
        what = "made no step in the last seconds before it"
    return finding(
        "script-hung",
        f"still running at the {timeout:g} s timeout and {what}; killed after {steps} steps at "
        f"{where}", evidence,
        fix="If a step lasts longer than the grace, raise --timeout or lower --steps so the run "
            "ends on its own; if steps are short, the script swallows the stop: a bare `except:` "
            "or `except BaseException` around the training step also catches torchdoctor's stop "
            "(and KeyboardInterrupt): catch `Exception` instead")


@rule("killed-by-signal", probes={"run"}, needs={"step"}, raises=[KILLED_BY_SIGNAL])
def killed_by_signal(ev: Evidence) -> list[Finding]:
    res = ev.result
    if res.get("outcome") != "signal":
        return []
    name = res.get("signal", "?")
    stacks = _stacks(ev)
    evidence: dict[str, Any] = {"signal": name, "steps_done": len(ev.of("step"))}
    if stacks.get("fatal"):
        evidence["fatal_error"] = stacks["fatal"]
        evidence.update(stack_evidence(stacks))
    tail = [ln for ln in res.get("output_tail") or [] if ln.strip()][-5:]
    if tail:
        evidence["last_output"] = tail
    hint = SIGNAL_HINTS.get(name, "the process received a fatal signal")
    fix = {"SIGKILL": "Lower host memory use (smaller batch, fewer DataLoader workers, "
                      "mmap'd datasets) or ask for more memory; run `torchdoctor memory`",
           "SIGBUS": "Give the container more shared memory (docker --shm-size=8g) or use "
                     "fewer DataLoader workers"}.get(name, "Re-run with the stack shown "
                                                        "(faulthandler) and fix the native "
                                                        "call it died in")
    return [finding("killed-by-signal", f"the script died by {name}: {hint}", evidence, fix=fix)]


@rule("no-training-steps", probes={"run"}, needs={"step", "model", "dataloader", "process_started"},
      raises=[NO_TRAINING_STEPS])
def no_training_steps(ev: Evidence) -> list[Finding]:
    res = ev.result
    outcome = res.get("outcome")
    if ev.of("step"):
        return []
    own = script_processes(ev)
    waited = outcome == "timeout" and own and waits_on_own_processes(ev)
    if outcome not in ("exit", "stopped", "interrupted") and not waited:
        return []  # crash / hang / signal: that finding says more
    if outcome == "exit" and res.get("exit_code") not in (0, None):
        return []
    forwards = len(ev.of("model"))
    evidence = {"outcome": outcome, "optimizer_steps": 0, "backward_calls": 0,
                "root_modules_seen": forwards, "dataloader_batches_seen": bool(ev.of("dataloader"))}
    if own:
        return [_trained_elsewhere(ev, evidence, own, waited)]
    other = int(res.get("other_thread_boundaries") or 0)
    if other:
        evidence["other_thread_boundaries"] = other
        return [finding(
            "no-training-steps",
            f"no step was followed: {other} optimizer step(s) or backward(s) ran in other threads, "
            "which ended while the main thread was still starting them, before torchdoctor could "
            "follow one, so the steps were not judged", evidence, severity="info",
            fix="torchdoctor follows one thread's loop: the main thread's, or a worker's once the "
                "main thread waits for the workers (join()). Give the workers more steps than "
                "their start-up takes, or start them all before any of them trains (a "
                "threading.Barrier at the top of the thread function), to have one followed")]
    return [finding("no-training-steps",
                    "no optimizer step or backward call was seen, so step-based checks could "
                    "not judge this run", evidence,
                    fix="Point torchdoctor at the script that trains (it must call "
                        "loss.backward() and optimizer.step()); pass the arguments that start "
                        "training; raise --timeout if training starts late")]


def script_processes(ev: Evidence) -> list[dict[str, Any]]:
    """Processes the script started that run its own code (not DataLoader or pool workers),
    grouped by target and start method: [{target, where, method, via, count}]."""
    groups: dict[tuple, dict[str, Any]] = {}
    for e in ev.of("process_started"):
        if e.get("role") != "script":
            continue
        key = (e.get("target"), e.get("where"), e.get("method"), e.get("via"))
        g = groups.setdefault(key, {"target": e.get("target") or "?", "where": e.get("where"),
                                    "method": e.get("method"), "via": e.get("via"), "count": 0})
        g["count"] += 1
    return list(groups.values())


# frames of a main thread that waits for processes it started: Process.join, mp.spawn's join
_JOINS = ("multiprocessing/process.py", "multiprocessing/popen_", "torch/multiprocessing/spawn.py")


def waits_on_own_processes(ev: Evidence) -> bool:
    """The main thread's stack at the timeout was in a join of processes it started."""
    from torchdoctor.runner.stacks import main_thread

    main = main_thread(_stacks(ev).get("threads") or [])
    return main is not None and any(j in str(f[0]) for f in main["frames"] for j in _JOINS)


def _trained_elsewhere(ev: Evidence, evidence: dict[str, Any], own: list[dict[str, Any]],
                      waited: bool) -> Finding:
    """No step here, but the script ran its own code in processes it started: the training
    was not missing, it was out of sight (info: the script is not at fault)."""
    n = sum(int(g.get("count") or 0) for g in own)
    lines = [f"{g['target']} at {short_path(g.get('where')) or '?'}: {g['count']} process(es), "
             f"start method {g.get('method') or '?'}" + (f", through {g['via']}" if g.get("via") else "")
             for g in own]
    spawn = any(g.get("via") == "torch.multiprocessing.spawn" for g in own)
    name = own[0]["target"].rpartition(".")[2]
    fix = ("torchdoctor measures the process it launches, not processes the script starts "
           "itself. ")
    if spawn:
        fix += ("For data-parallel training started with torch.multiprocessing.spawn, let "
                "torchrun start one process per rank instead (the script then reads RANK, "
                "LOCAL_RANK and WORLD_SIZE from the environment) and run `torchdoctor checkup "
                "--nproc-per-node N script.py`: every rank is then measured")
    else:
        fix += ("To measure the training, run its loop in the launched process: call "
                f"`{name}(...)` directly when one process is asked for (for example behind a "
                "flag), then run torchdoctor on that")
    ended = ""
    if waited:
        timeout = ev.result.get("timeout_s") or ev.options.get("timeout")
        ended = (f"; stopped at the {float(timeout or 0):g} s timeout while it waited for them (whether they "
                 f"were training or stuck is not measured)")
        evidence["timeout_s"] = timeout
    return finding("no-training-steps",
                   f"no step was seen in the launched process: the script ran its own "
                   f"`{name}` in {n} process(es) it started itself, which torchdoctor does not "
                   f"follow, so their steps were not judged{ended}",
                   {**evidence, "processes_started": lines}, fix=fix, severity="info")
