"""Numerics rules: the first non-finite value (forward, gradient, loss), and the crash codes of the
family (raised by rules/crash.py). Exploding gradients and float16 without scaling: grad_scale.py.

Pure functions of the evidence written by ``instruments/nan/nan_monitor.py`` (``nonfinite``,
``numerics``, ``grad_norm_overflow``, ``nan_monitor``) and ``instruments/training/training_modes.py``
(``amp``). The thresholds are the constants declared with each code below (why these values:
``docs/findings/<code>.md``).
"""

from __future__ import annotations

import math
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import DEBUGGING, MODULE_DESIGN

NAN_PROBES = {"nan", "checkup"}

NONFINITE_FORWARD = declare("nonfinite-forward", DEBUGGING, "error",
                            "first module whose output has NaN/Inf while its inputs are finite")
NONFINITE_GRADIENT = declare("nonfinite-gradient", DEBUGGING, "error",
                             "first parameter whose gradient is NaN/Inf while the loss is finite")
NONFINITE_LOSS = declare("nonfinite-loss", DEBUGGING, "error",
                         "loss became NaN/Inf and no earlier localization was possible")
# crashes of the numerics family, raised by the crash rule (rules/crash.py) from the exception's
# text; the inplace-modified follow-up re-run is in pipeline/followups_nan.py
INPLACE_MODIFIED = declare("inplace-modified", DEBUGGING, "error",
                           "crash 'modified by an inplace operation': the forward op and line")
DEVICE_MISMATCH = declare(
    "device-mismatch", MODULE_DESIGN, "error",
    "crash 'Expected all tensors to be on the same device': the tensor's origin")


# ---------------------------------------------------------------------------- helpers
def as_float(x: Any) -> float | None:
    """A number from evidence (floats, or the strings "nan"/"inf"/"-inf"); None if absent."""
    if x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _values(d: dict) -> list:
    """The measured values of a record: [min, max] (``minmax``) or [max |x|] (``absmax``,
    the fused CUDA reduction)."""
    if d.get("absmax") is not None:
        return [d["absmax"]]
    return list(d.get("minmax") or [])


def _kind(d: dict) -> str:
    """'NaN' or 'Inf' from a non-finite record's measured values."""
    vals = [as_float(v) for v in _values(d)]
    if any(v is not None and math.isnan(v) for v in vals):
        return "NaN"
    if any(v is not None and math.isinf(v) for v in vals):
        return "Inf"
    return "NaN/Inf"


def _fmt(d: dict) -> str:
    """'min/max [a, b]', 'max|x| a', or 'not measured'."""
    if d.get("absmax") is not None:
        return f"max|x| {d['absmax']}"
    mm = d.get("minmax")
    if not mm:
        return "not measured (modified in place before it was checked)"
    return f"min/max [{mm[0]}, {mm[1]}]"


def _io_lines(items: list | None) -> list[str]:
    return [f"#{x.get('index', i)} {_fmt(x)}" for i, x in enumerate(items or [])]


def grad_norm_series(ev: Evidence) -> dict[int, list[tuple[int, float | None]]]:
    """Grad norms per optimizer index: [(step, norm or None)], in order."""
    out: dict[int, list[tuple[int, float | None]]] = {}
    for e in ev.of("numerics"):
        for step, opt, gn in zip(e.get("steps", []), e.get("opt", []), e.get("grad_norm", [])):
            if gn is None or opt is None:
                continue
            out.setdefault(int(opt), []).append((int(step), as_float(gn)))
    return out


def monitor_ran(ev: Evidence) -> None:
    if not ev.has("nan_monitor") and not ev.has("numerics") and not ev.has("nonfinite"):
        raise NotApplicable("the non-finite monitor did not report (the run ended before it could)")


# ---------------------------------------------------------------------------- non-finite
FORWARD_FIXES = [
    "Make the op named in the evidence safe for the values it got: add an epsilon to divisors "
    "and to log/sqrt inputs, clamp before exp, use the fused stable forms (log_softmax, "
    "logsumexp, F.binary_cross_entropy_with_logits, F.cross_entropy on logits)",
    "if the module's weights are already non-finite, an earlier update diverged: lower the "
    "learning rate, add warmup and gradient clipping (torch.nn.utils.clip_grad_norm_)",
    "under float16 autocast, prefer bfloat16 or run this op in float32 "
    "(with torch.autocast(device, enabled=False): ...)",
]
INPUT_FIXES = [
    "Check the data pipeline: find the sample (torch.isfinite(x).all() per item in the "
    "Dataset's __getitem__) and the preprocessing that made it (division by a zero std, log of "
    "zero, corrupt files)",
    "filter or repair non-finite samples before they reach the model",
]
GRAD_FIXES = [
    "Look for ops whose derivative is infinite where the forward is finite: sqrt/pow(x, 0.5) "
    "at 0 (e.g. a norm of a zero vector: use torch.linalg.vector_norm or add eps inside the "
    "sqrt), log near 0, acos/asin at ±1, division by a small value",
    "clip gradients (torch.nn.utils.clip_grad_norm_) and lower the learning rate if the "
    "gradient grew before turning non-finite",
    "under float16, use a GradScaler (it skips steps whose gradients overflow)",
]
LOSS_FIXES = [
    "Compute the loss in its stable form: F.cross_entropy / F.binary_cross_entropy_with_logits "
    "on logits instead of log(softmax) or BCE on sigmoid outputs; add eps to divisions and logs",
    "check the targets for invalid values (NaN labels, class indices out of range, zero "
    "denominators such as an empty mask in a masked mean)",
    "run `torchdoctor nan SCRIPT` to name the op that produced it",
]


def _forward_finding(nf: dict[str, Any], ev: Evidence) -> Finding:
    step = nf.get("step")
    mod, cls = nf.get("module", "?"), nf.get("module_class", "?")
    evidence: dict[str, Any] = {"step": step, "module": mod, "module_class": cls}
    if nf.get("call"):
        evidence["call"] = f"call #{nf['call'] + 1} of this module in the step"
    if nf.get("forward_source"):
        evidence["forward_source"] = nf["forward_source"]
    if not nf.get("grad_enabled", True):
        evidence["grad_enabled"] = False
    params = nf.get("nonfinite_params") or []
    if params:
        evidence["nonfinite_params"] = params
    if nf.get("earlier_neg_inf"):
        evidence["earlier_neg_inf"] = nf["earlier_neg_inf"]
    if nf.get("between_children"):
        recv = nf.get("receiver") or {}
        kind = _kind(recv)
        evidence["made_between_children"] = (
            f"{recv.get('module')} ({recv.get('module_class')}) received a non-finite ({kind}) "
            f"input #{recv.get('input_index', 0)} although every module output checked before was finite")
        title = (f"first non-finite value ({kind}) at step {step}: made by {mod} ({cls})'s own "
                 f"forward code, between its submodules")
        mip = nf.get("modified_in_place")
        if mip:
            evidence["modified_in_place"] = (
                f"that input is the {mip.get('role', 'output')} of {mip.get('module')} "
                f"({mip.get('module_class')}), modified in place by this code before it was "
                f"checked (e.g. `out += identity`): the non-finite value came from that module "
                f"or from the in-place op; the re-run names the op")
        if nf.get("inputs"):
            evidence["inputs"] = _io_lines(nf.get("inputs"))
    else:
        outs = nf.get("outputs") or []
        bad = next((o for o in outs if o.get("index") == nf.get("output_index")), outs[0] if outs else {})
        kind = _kind(bad)
        title = (f"first non-finite value ({kind}) at step {step}: output of {mod} ({cls}) while "
                 f"its inputs were finite")
        evidence["outputs"] = _io_lines(outs)
        evidence["inputs"] = _io_lines(nf.get("inputs")) or ["(no floating-point inputs)"]
    if params:
        title += "; its weights were already non-finite"
    if not nf.get("grad_enabled", True):
        title += " (in a forward without grad: evaluation?)"
    fixes = list(FORWARD_FIXES)
    if params:
        fixes = [fixes[1], fixes[0], fixes[2]]
    return finding("nonfinite-forward", title, evidence, fix="; ".join(fixes))


def _input_finding(nf: dict[str, Any]) -> Finding:
    step = nf.get("step")
    recv = nf.get("receiver") or {}
    kind = _kind(recv)
    mod, cls = nf.get("module", "?"), nf.get("module_class", "?")
    evidence = {"step": step, "module": mod, "module_class": cls,
                "input": f"#{recv.get('input_index', 0)} {_fmt(recv)}",
                "inputs": _io_lines(nf.get("inputs"))}
    if not nf.get("grad_enabled", True):
        evidence["grad_enabled"] = False
    title = (f"the input of {mod} ({cls}) already holds {kind} at step {step}: the data (or the "
             f"code before the model), not a layer")
    return finding("nonfinite-forward", title, evidence, fix="; ".join(INPUT_FIXES))


def _loss_finding(nf: dict[str, Any], watched: bool, probe: str | None = None) -> Finding:
    step = nf.get("step")
    vals = nf.get("loss") or []
    kind = "NaN" if "nan" in vals else ("Inf" if any(v in ("inf", "-inf") for v in vals) else "NaN/Inf")
    evidence: dict[str, Any] = {"step": step, "loss": vals[:4]}
    if nf.get("loss_shape") is not None:
        evidence["loss_shape"] = nf["loss_shape"]
        evidence["loss_dtype"] = nf.get("loss_dtype")
    mo = nf.get("model_output")
    if mo:
        evidence["model_output"] = f"{mo.get('module')} ({mo.get('module_class')}) {_fmt(mo)}"
    if watched:
        title = (f"loss became {kind} at step {step} while every module output was finite: "
                 f"the loss computation made it")
    elif probe == "nan":
        title = (f"loss became {kind} at step {step} (module outputs were not watched: the "
                 f"re-run of that step names the op and the module it ran in)")
        evidence["forward_watch"] = False
    else:
        title = (f"loss became {kind} at step {step} (module outputs were not watched in this "
                 f"probe: `torchdoctor nan` names the first layer or op)")
        evidence["forward_watch"] = False
    return finding("nonfinite-loss", title, evidence, fix="; ".join(LOSS_FIXES))


def _grad_finding(nf: dict[str, Any]) -> Finding:
    step = nf.get("step")
    p = nf.get("param", "?")
    stats = nf.get("grad_stats") or {}
    kind = ("NaN" if stats.get("nan") else "Inf") if stats else (
        "NaN" if nf.get("grad_norm") == "nan" else "NaN/Inf")
    evidence: dict[str, Any] = {"step": step, "param": p, "param_shape": nf.get("param_shape"),
                                "bad_params": f"{nf.get('bad_count')} of {nf.get('params_with_grad')}"
                                              " parameters with a gradient",
                                "first_in": f"{nf.get('order', 'backward')} order"}
    if nf.get("module"):
        evidence["module"] = f"{nf['module']} ({nf.get('module_class')})"
    if stats:
        from torchdoctor.numerics.tensors import describe

        evidence["grad"] = describe(stats)
    if nf.get("losses"):
        evidence["loss"] = "finite"
    others = [x for x in nf.get("bad_params") or [] if x != p]
    if others:
        evidence["also"] = others[:6]
    title = (f"gradient of {p} is {kind} at step {step} while the loss and every module output "
             f"were finite" if nf.get("forward_watch") else
             f"gradient of {p} is {kind} at step {step} while the loss was finite")
    return finding("nonfinite-gradient", title, evidence, fix="; ".join(GRAD_FIXES))


@rule("nonfinite", probes=NAN_PROBES, needs={"nonfinite", "numerics", "nan_monitor"},
      raises=[NONFINITE_FORWARD, NONFINITE_GRADIENT, NONFINITE_LOSS])
def nonfinite(ev: Evidence) -> list[Finding]:
    """nonfinite-forward / nonfinite-gradient / nonfinite-loss from the monitor's first event."""
    nf = ev.last("nonfinite")
    if nf is None:
        monitor_ran(ev)
        if not ev.of("numerics"):
            raise NotApplicable("no backward or optimizer step was seen, so no loss or gradient "
                                "was checked")
        return []
    what = nf.get("what")
    watched = bool(nf.get("forward_watch"))
    if what == "forward":
        return [_forward_finding(nf, ev)]
    if what == "input":
        return [_input_finding(nf)]
    if what == "loss":
        return [_loss_finding(nf, watched, ev.meta.get("probe"))]
    if what == "gradient":
        return [_grad_finding(nf)]
    return []
