"""Follow-up runs of the numerics family.

* ``inplace-modified``: run again up to the failing step with anomaly mode switched on right
  before it (``anomaly_from_step``, read by ``instruments/crash/training_anomaly.py``); the
  "Traceback of forward call" names the forward op and the user's line.
* ``nonfinite-forward`` / ``nonfinite-loss`` (``nan`` probe only): run again to the step the
  first run located and check that one module call (or the loss code) op by op
  (``nan_capture``, read by ``instruments/nan/nan_capture.py``): the op, its line, exact stats.
  ``--no-rerun`` (option ``rerun``: false) skips it.
* ``nonfinite-loss`` in ``checkup`` (whose monitor does not watch module outputs, for cost):
  *replay* the script to that step under the ``nan`` probe's instruments, forward watch on and
  the step checked op by op (``nan_capture`` ``what: "step"``), stopping right after it. The
  replay's own ``nonfinite`` finding (the module, or the data, or the loss code) replaces
  ``nonfinite-loss``, with the op and its line; a replay that does not reproduce the value
  (an unseeded script) says so in the evidence and the first finding stays. ``--no-rerun``
  skips it. One extra run to the step (its seconds are in ``metrics.followups``).
"""

from __future__ import annotations

import time
from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.pipeline.followups import followup


@followup("inplace-modified")
def anomaly_rerun(ev: Evidence, relaunch) -> dict[str, Any]:
    if ev.options.get("anomaly_from_step") is not None:
        return {}  # this already is the follow-up run
    steps = int(ev.result.get("steps") or 0)
    ev2 = relaunch({"anomaly_from_step": steps, "steps": steps + 1})
    t = ev2.last("anomaly_trace")
    if not t:
        outcome = (ev2.result or {}).get("outcome")
        return {"anomaly_rerun": f"re-ran step {steps + 1} under anomaly mode; no forward trace "
                                 f"was reported (re-run outcome: {outcome})"}
    out: dict[str, Any] = {"forward_op": t.get("op"), "forward_node": t.get("node")}
    if t.get("where"):
        out["forward_line"] = t["where"]
    if t.get("code"):
        out["forward_code"] = t["code"]
    frames = t.get("forward_trace") or []
    if len(frames) > 1:
        out["forward_trace"] = [f"{f['file']}:{f['line']} in {f['function']}" for f in frames[-5:]]
    out["anomaly_rerun"] = f"re-ran step {steps + 1} under torch.autograd.set_detect_anomaly(True)"
    if t.get("custom_function"):
        out["custom_function"] = t.get("op")
        out["_skill"] = "custom-autograd-functions"
    return out


def _capture(ev: Evidence, relaunch, what: str) -> dict[str, Any]:
    if ev.meta.get("probe") != "nan" or ev.options.get("nan_capture"):
        return {}
    if ev.options.get("rerun") is False:
        return {}
    nf = ev.last("nonfinite")
    if not nf or not nf.get("step"):
        return {}
    step = int(nf["step"])
    if what == "call":
        target = nf.get("target")
        if not target or target.get("path") is None:
            return {"op": "not named: the module is not reachable from a root model by name"}
        spec = {"step": step, "what": "call", "target": target}
    else:
        spec = {"step": step, "what": what}
    ev2 = relaunch({"nan_capture": spec, "steps": step})
    return _capture_evidence(ev2, step, what)


def _capture_evidence(ev2: Evidence, step: int, what: str) -> dict[str, Any]:
    """The op, its line and exact stats from a re-run's ``nan_capture`` event."""
    cap = ev2.last("nan_capture")
    if not cap:
        return {"op": f"not named: the re-run ended before step {step} "
                      f"({(ev2.result or {}).get('outcome')})"}
    if not cap.get("reproduced"):
        return {"op": f"not named: the re-run did not reproduce the non-finite value at step "
                      f"{step} (is the script seeded and deterministic?)"}
    out: dict[str, Any] = {}
    op = cap.get("op")
    if op:
        out["op"] = op.get("op")
        if op.get("where"):
            out["op_line"] = op["where"]
        if op.get("code"):
            out["op_code"] = op["code"]
        from torchdoctor.numerics.tensors import describe

        if op.get("in_module"):
            out["op_module"] = op["in_module"]
        out["op_inputs"] = [describe(s) for s in (op.get("inputs") or [])[:3]]
        out["op_outputs"] = [describe(s) for s in (op.get("outputs") or [])[:2]]
    else:
        out["op"] = "not named: every op's output in that call was finite or had non-finite inputs"
    if what == "call":
        from torchdoctor.numerics.tensors import describe

        if cap.get("call_site"):
            out["called_from"] = cap["call_site"][0]
        out["input_stats"] = [describe(s) for s in (cap.get("inputs") or [])]
        out["output_stats"] = [describe(s) for s in (cap.get("outputs") or [])]
    return out


@followup("nonfinite-forward")
def capture_forward(ev: Evidence, relaunch) -> dict[str, Any]:
    nf = ev.last("nonfinite") or {}
    if nf.get("what") not in ("forward",):
        return {}
    return _capture(ev, relaunch, "call")


@followup("nonfinite-loss")
def capture_loss(ev: Evidence, relaunch) -> dict[str, Any]:
    """Watched forward: only the loss code can have made it. Unwatched (--no-forward-watch):
    check the whole forward of that step and the loss code op by op."""
    nf = ev.last("nonfinite") or {}
    if nf.get("what") != "loss":
        return {}
    return _capture(ev, relaunch, "loss" if nf.get("forward_watch") else "step")


# what the checkup replay arms on top of the nan probe's defaults (explicit: the replay must not
# inherit checkup's cheaper settings through the options)
REPLAY_OPTIONS = {"forward_watch": True, "check_every": 1, "stop_on_nonfinite": True}
# the replay is the same run when its losses before the bad step match the first run's to
# this relative tolerance: GPU kernels that are not deterministic drift apart slowly (seeded
# float32 index_add_ on an H100: 8e-4 relative after 199 steps, docs NOTES); an unseeded
# script draws other batches, whose losses differ by far more from step 1
REPLAY_LOSS_RTOL = 1e-2


def _losses(ev: Evidence, before: int) -> dict[tuple[int, int], float]:
    """{(step, optimizer): finite loss} of the steps before ``before``."""
    out: dict[tuple[int, int], float] = {}
    for e in ev.of("numerics"):
        for st, opt, loss in zip(e.get("steps", []), e.get("opt", []), e.get("loss", [])):
            if st is None or int(st) >= before or not isinstance(loss, (int, float)):
                continue
            out[(int(st), int(opt or 0))] = float(loss)
    return out


def _diverged(ev: Evidence, ev2: Evidence, step: int) -> str | None:
    """Where the replay's losses before ``step`` first differ from the first run's, or None."""
    a, b = _losses(ev, step), _losses(ev2, step)
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if abs(x - y) > REPLAY_LOSS_RTOL * max(abs(x), abs(y)) + 1e-12:
            return (f"the loss of step {key[0]} was {x:.6g} in the first run and {y:.6g} in "
                    f"the replay")
    return None


def _not_seeded(ev: Evidence) -> bool:
    s = ev.last("seeding")
    return s is not None and not s.get("calls")


def _replay_saw(ev2: Evidence) -> str:
    nf2 = ev2.last("nonfinite")
    if nf2 is None:
        return ""
    where = nf2.get("module") or nf2.get("param")
    return (f"; the replay's own first non-finite value: step {nf2.get('step')}, "
            f"{nf2.get('what')}" + (f" of {where} ({nf2.get('module_class')})"
                                    if nf2.get("module") else (f" {where}" if where else "")))


@followup("nonfinite-loss")
def replay_forward_watch(ev: Evidence, relaunch) -> dict[str, Any]:
    """checkup only: replay the run to the step whose loss went non-finite, under the nan
    probe's instruments, and report what that replay located instead of ``nonfinite-loss``.

    The replay counts as the same run only if its first non-finite value is at the same step,
    in the forward or the loss, and its losses before that step are the first run's; else the
    evidence says it was not reproduced (and what the replay saw), and nothing is named."""
    if ev.meta.get("probe") != "checkup" or ev.options.get("rerun") is False:
        return {}
    nf = ev.last("nonfinite") or {}
    if nf.get("what") != "loss" or nf.get("forward_watch") or not nf.get("step"):
        return {}
    step = int(nf["step"])
    t0 = time.perf_counter()
    ev2 = relaunch({**REPLAY_OPTIONS, "steps": step + 1,
                    "nan_capture": {"step": step, "what": "step"}}, probe="nan")
    secs = time.perf_counter() - t0
    head = (f"replayed the script to step {step} under the nan probe's instruments (every "
            f"module output watched, that step checked op by op; {secs:.1f} s)")
    nf2 = ev2.last("nonfinite")
    res = ev2.result or {}
    seed = (" The script never seeds its random generators (no torch.manual_seed, random.seed "
            "or numpy seed call was seen)." if _not_seeded(ev) else "")
    diverged = _diverged(ev, ev2, step)
    why = None
    if diverged:
        why = f"{diverged}: the run is not reproducible"
    elif nf2 is not None and (nf2.get("step") != step
                              or nf2.get("what") not in ("forward", "input", "loss")):
        why = (f"its first non-finite value was a {nf2.get('what')} at step "
               f"{nf2.get('step')}, not the loss at step {step}: the run is not reproducible")
    elif nf2 is None:
        if res.get("outcome") in ("stopped", "exit") and int(res.get("steps") or 0) >= step:
            why = f"every value stayed finite through step {step}: the run is not reproducible"
        else:
            why = (f"it ended before step {step} (outcome {res.get('outcome')}, "
                   f"{res.get('steps', 0)} steps)")
    if why is not None:
        saw = _replay_saw(ev2) if diverged else ""
        return {"replay": f"{head}; not reproduced — {why}{saw}. The layer and op are not "
                          f"named.{seed} `torchdoctor nan` watches every module from the first "
                          f"step."}
    from torchdoctor.rules.numerics import nonfinite

    extra: dict[str, Any] = {"_replace": nonfinite(ev2)[0]}
    if nf2.get("what") != "input":  # a value that came with the data was made by no op
        cap = _capture_evidence(ev2, step, "step")
        if str(cap.get("op", "")).startswith("not named: the re-run did not reproduce"):
            cap["op"] = ("not named: no op of that step's forward and loss code turned finite "
                         "inputs non-finite")
        extra.update(cap)
    extra["replay"] = (f"{head}; checkup itself saw only the loss turn non-finite at step "
                       f"{step} (module outputs are not watched there)")
    if _not_seeded(ev):
        extra["replay"] += (". The script never seeds its random generators: the replay's losses "
                            "matched the first run's and its value came at the same step, but it "
                            "is the replay's value, not proven to be the first run's")
    return extra
