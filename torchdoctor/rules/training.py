"""Training-bug rules: gradients not cleared, eval mode, unused / unoptimized / unregistered
parameters, loss inputs that broadcast.

Pure functions of the evidence written by ``instruments/training/training_grads.py``
(``zero_grad_stale``, ``zero_grad_summary``, ``params_audit``) and
``instruments/training/training_modes.py`` (``eval_mode``, ``eval_mode_summary``, ``loss_shape``).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import DEBUGGING, MODULE_DESIGN

PROBES = {"nan", "checkup"}
MIN_AUDIT_STEPS = 2  # optimizer steps before "never received a gradient" is judged

MISSING_ZERO_GRAD = declare("missing-zero-grad", DEBUGGING, "error",
                            "gradients accumulate across optimizer steps without being cleared")
EVAL_MODE_TRAINING = declare(
    "eval-mode-training", DEBUGGING, "warning",
    "optimizer steps while modules with Dropout/BatchNorm are in eval mode")
UNUSED_PARAMETERS = declare("unused-parameters", MODULE_DESIGN, "warning",
                            "parameters that require grad never receive a gradient",
                            thresholds={"MIN_AUDIT_STEPS": MIN_AUDIT_STEPS})
PARAMS_NOT_IN_OPTIMIZER = declare("params-not-in-optimizer", MODULE_DESIGN, "warning",
                                  "trainable parameters absent from every optimizer param group")
UNREGISTERED_SUBMODULE = declare(
    "unregistered-submodule", MODULE_DESIGN, "warning",
    "an nn.Module held in a plain list/dict/tuple attribute, so its parameters are not registered")
LOSS_SHAPE_BROADCAST = declare("loss-shape-broadcast", DEBUGGING, "warning",
                               "loss inputs broadcast to a different shape (e.g. [B,1] vs [B])")


def _names(items: list[dict], n: int = 6) -> str:
    shown = ", ".join(x["name"] for x in items[:n])
    return shown + (f", … ({len(items) - n} more)" if len(items) > n else "")


def _backwards_at(ev: Evidence, step: int | None) -> int | None:
    for s in ev.of("step"):
        if s.get("step") == step:
            return s.get("backwards")
    return None


# ---------------------------------------------------------------------------- zero_grad
@rule("missing-zero-grad", probes=PROBES, needs={"zero_grad_summary", "zero_grad_stale", "step"},
      raises=[MISSING_ZERO_GRAD])
def missing_zero_grad(ev: Evidence) -> list[Finding]:
    summary = ev.last("zero_grad_summary")
    if summary is None:
        raise NotApplicable("the gradient watch did not report")
    if not summary.get("judged_steps"):
        raise NotApplicable("fewer than two steps of one optimizer: nothing to compare")
    norms = summary.get("suspect_norms") or []
    confirmed = []
    for e in ev.of("zero_grad_stale"):
        refs = e.get("norms_ref") or []
        cleared = 0
        for k, pos in refs:
            try:
                if float(norms[k][pos]) == 0.0:
                    cleared += 1
            except (IndexError, TypeError, ValueError):
                pass
        # every suspect read as an all-zero gradient: zeroed through .data (no version bump)
        if refs and cleared == len(refs) and len(refs) == e.get("stale"):
            continue
        confirmed.append(e)
    if not confirmed:
        return []
    e = confirmed[0]
    step = e.get("step")
    evidence: dict[str, Any] = {
        "step": step, "optimizer": e.get("optimizer"),
        "not_cleared": f"{e.get('stale')} of {e.get('with_grad')} parameters with a gradient",
        "consumed_at_step": e.get("consumed_at"),
        "params": e.get("params", [])[:8],
        "steps_affected": (summary.get("stale_steps") if len(confirmed) == len(ev.of("zero_grad_stale"))
                           else len(confirmed)),
        "steps_judged": summary.get("judged_steps"),
    }
    bw = _backwards_at(ev, step)
    if bw is not None:
        evidence["backwards_in_step"] = bw
    if e.get("optimizer_at"):
        evidence["optimizer_built_at"] = short_path(e["optimizer_at"])
    if e.get("step_at"):
        evidence["step_called_at"] = short_path(e["step_at"])
    where = evidence.get("step_called_at") or evidence.get("optimizer_built_at")
    title = (f"gradients were not cleared before step {step}: {e.get('stale')} of "
             f"{e.get('with_grad')} parameters still held the gradients step "
             f"{e.get('consumed_at')} had applied, and the next backward added to them"
             + (f" (optimizer.step() at {where})" if evidence.get("step_called_at") else
                f" (optimizer built at {where})" if where else ""))
    return [finding("missing-zero-grad", title, evidence, fix=(
        "Call optimizer.zero_grad(set_to_none=True) once per optimizer step (before the "
        "backward of the next step); for deliberate gradient accumulation, zero right after "
        "optimizer.step() and divide the loss by the number of micro-batches"))]


# ---------------------------------------------------------------------------- eval mode
@rule("eval-mode-training", probes=PROBES, needs={"eval_mode_summary", "eval_mode"},
      raises=[EVAL_MODE_TRAINING])
def eval_mode_training(ev: Evidence) -> list[Finding]:
    summary = ev.last("eval_mode_summary")
    if summary is None:
        raise NotApplicable("the module-mode watch did not report")
    if not summary.get("judged_steps"):
        raise NotApplicable("no optimizer step was seen")
    if summary.get("mode_modules") == 0 and not ev.has("eval_mode"):
        raise NotApplicable("the models have no Dropout or BatchNorm module: eval mode changes nothing")
    first = ev.last("eval_mode") or summary.get("first")
    if not first:
        return []
    step = first.get("step")
    evidence = {"step": step, "modules": first.get("modules"), "count": first.get("count"),
                "steps_in_eval_mode": f"{summary.get('eval_steps')} of {summary.get('judged_steps')}"
                                      " optimizer steps"}
    flags = first.get("roots_training_flag") or {}
    if flags:
        evidence["root_training_flag"] = flags
    mods = first.get("modules") or []
    at = short_path(first.get("eval_at"))
    if at:
        evidence["eval_called_at"] = at
    title = (f"training in eval mode from step {step}: {first.get('count')} Dropout/BatchNorm "
             f"module(s) of trained layers were in eval mode ({', '.join(mods[:3])}"
             f"{', …' if len(mods) > 3 else ''})"
             + (f"; set by the eval() at {at}, with no train() after it" if at else ""))
    return [finding("eval-mode-training", title, evidence, fix=(
        "Call model.train() before the training loop and again after every evaluation "
        "(model.eval() ... model.train()); to freeze BatchNorm statistics on purpose, also "
        "freeze its parameters (requires_grad_(False)) so the intent is explicit"))]


# ---------------------------------------------------------------------------- params audit
def _created_at(items: list[dict]) -> dict[str, list[str]]:
    """{"file:line" that built the module: [its parameters]}, in the order first seen."""
    out: dict[str, list[str]] = {}
    for x in items:
        if x.get("created_at"):
            out.setdefault(short_path(x["created_at"]), []).append(x["name"])
    return out


def _audit(ev: Evidence) -> dict[str, Any]:
    audits = ev.of("params_audit")
    if not audits:
        raise NotApplicable("no optimizer step was seen, so no parameter audit ran")
    finals = [a for a in audits if a.get("final")]
    return (finals or audits)[-1]


@rule("unused-parameters", probes=PROBES, needs={"params_audit"}, raises=[UNUSED_PARAMETERS])
def unused_parameters(ev: Evidence) -> list[Finding]:
    a = _audit(ev)
    steps = int(a.get("optimizer_steps") or 0)
    if steps < MIN_AUDIT_STEPS:
        raise NotApplicable(f"only {steps} optimizer step(s): too few to call a parameter unused")
    unused = a.get("unused") or []
    n = int(a.get("unused_count") or len(unused))
    if not n:
        return []
    numel = sum(int(x.get("numel") or 0) for x in unused)
    title = (f"{n} trainable parameter(s) ({numel:,} values) never received a gradient in "
             f"{steps} optimizer steps: {_names(unused, 4)}")
    evidence = {"step": 1, "optimizer_steps": steps, "params": [x["name"] for x in unused[:20]],
                "count": n, "values": numel, "trainable": a.get("trainable")}
    sites = _created_at(unused)
    if sites:
        evidence["created_at"] = sites
    return [finding("unused-parameters", title, evidence, fix=(
        "Use the layer in forward or delete it; if it is frozen on purpose, call "
        "requires_grad_(False) on it; under DistributedDataParallel, unused parameters need "
        "find_unused_parameters=True (slower) or, better, removing them"))]


@rule("params-not-in-optimizer", probes=PROBES, needs={"params_audit"},
      raises=[PARAMS_NOT_IN_OPTIMIZER])
def params_not_in_optimizer(ev: Evidence) -> list[Finding]:
    a = _audit(ev)
    items = a.get("not_in_optimizer") or []
    n = int(a.get("not_in_optimizer_count") or len(items))
    if not n:
        return []
    numel = sum(int(x.get("numel") or 0) for x in items)
    with_grad = sum(1 for x in items if x.get("has_grad"))
    sites = _created_at(items)
    title = (f"{n} trainable parameter(s) ({numel:,} values) are in no optimizer, so they never "
             f"change: {_names(items, 4)}"
             + (f" (built at {', '.join(list(sites)[:2])})" if sites else ""))
    evidence = {"step": 1, "params": [x["name"] for x in items[:20]], "count": n, "values": numel,
                "received_gradients": f"{with_grad} of {n} (backward computes them for nothing)",
                "optimizers": a.get("optimizers"), "trained_models": a.get("trained_roots")}
    if sites:
        evidence["created_at"] = sites
    return [finding("params-not-in-optimizer", title, evidence, fix=(
        "Build the optimizer from model.parameters() (or add the missing group with "
        "optimizer.add_param_group) after every layer exists; if these layers are frozen on "
        "purpose, call requires_grad_(False) on them so backward skips them"))]


@rule("unregistered-submodule", probes=PROBES, needs={"params_audit"},
      raises=[UNREGISTERED_SUBMODULE])
def unregistered_submodule(ev: Evidence) -> list[Finding]:
    a = _audit(ev)
    hidden = a.get("unregistered") or []
    if not hidden:
        return []
    h = hidden[0]
    attrs = sorted({x["attribute"].split("[")[0] for x in hidden})
    total = sum(int(x.get("params") or 0) for x in hidden)
    title = (f"{len(hidden)} module(s) with {total:,} parameters are held in plain "
             f"{h.get('container')} attribute(s) ({', '.join(attrs[:3])}), so the model does not "
             f"register them")
    evidence = {"step": 1, "attributes": [f"{x['attribute']}: {x['module_class']} "
                                          f"({x['params']:,} params)" for x in hidden[:10]],
                "in_optimizer": any(x.get("in_optimizer") for x in hidden),
                "received_gradients": any(x.get("received_grad") for x in hidden)}
    return [finding("unregistered-submodule", title, evidence, fix=(
        "Hold submodules in nn.ModuleList / nn.ModuleDict (or assign them as attributes) so "
        "model.parameters(), .to(device), state_dict() and train()/eval() see them"))]


# ---------------------------------------------------------------------------- loss shapes
@rule("loss-shape-broadcast", probes=PROBES, needs={"loss_shape", "loss_watch"},
      raises=[LOSS_SHAPE_BROADCAST])
def loss_shape_broadcast(ev: Evidence) -> list[Finding]:
    recs = ev.of("loss_shape")
    if not recs:
        watch = ev.last("loss_watch")
        if watch is None:
            raise NotApplicable("the loss watch did not report")
        if not watch.get("calls"):
            raise NotApplicable("no call of " + ", ".join(watch.get("functions") or []) +
                                ": other losses' input shapes are not checked")
        return []
    r = sorted(recs, key=lambda x: x.get("step") or 0)[0]
    where = f" at {r['where']}" if r.get("where") else ""
    title = (f"{r['fn']} got input {r['input_shape']} and target {r['target_shape']}{where}: "
             f"they broadcast to {r.get('result_shape')}, so the loss compares every prediction "
             f"with every target")
    evidence = {"step": r.get("step"), "fn": r["fn"], "input_shape": r["input_shape"],
                "target_shape": r["target_shape"], "broadcast_shape": r.get("result_shape"),
                "calls": r.get("count")}
    if r.get("where"):
        evidence["where"] = r["where"]
    if r.get("code"):
        evidence["code"] = r["code"]
    if len(recs) > 1:
        evidence["other_calls"] = [f"{x['fn']} {x['input_shape']} vs {x['target_shape']}" for x in recs[1:4]]
    return [finding("loss-shape-broadcast", title, evidence, fix=(
        "Make the shapes equal before the loss: pred.squeeze(-1) or target.unsqueeze(-1) "
        "(or target.view_as(pred))"))]
