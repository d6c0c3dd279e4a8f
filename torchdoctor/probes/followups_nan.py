"""Follow-up runs of the numerics family.

* ``inplace-modified``: run again up to the failing step with anomaly mode switched on right
  before it (``anomaly_from_step``, read by ``instruments/training_anomaly.py``); the
  "Traceback of forward call" names the forward op and the user's line.
* ``nonfinite-forward`` / ``nonfinite-loss`` (``nan`` probe only): run again to the step the
  first run located and check that one module call (or the loss code) op by op
  (``nan_capture``, read by ``instruments/nan_capture.py``): the op, its line, exact stats.
  ``--no-rerun`` (option ``rerun``: false) skips it.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.probes.followups import followup


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
