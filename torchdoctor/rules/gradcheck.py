"""Custom autograd Functions checked on their real calls (``torchdoctor gradcheck``).

Pure functions of the evidence of ``instruments/training/autograd_capture.py``: ``gradcheck_call`` (one per
checked call: per input, the element-by-element comparison of analytical and numerical gradients,
torch.autograd.gradcheck's verdict, gradgradcheck's), ``autograd_dirty``, ``autograd_ctx_tensors``,
``autograd_function`` and ``gradcheck_summary``. See docs/gradcheck.md.

An input's gradient is **wrong** on a call when some compared elements disagree beyond the
tolerance at both finite-difference steps, away from any kink, and torch.autograd.gradcheck (when
it ran) did not pass. It is a **surrogate** (straight-through estimator) when, in addition, the
numerical gradient is zero on every compared element while the output does change when the input
moves by its own scale: the forward is piecewise constant and the backward deliberately returns
something else (info, never a warning).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.gradcheck.limits import ATOL, EPS, EPS_CONFIRM, RTOL
from torchdoctor.gradcheck.returns import classify
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import CUSTOM_AUTOGRAD

PROBES = {"gradcheck"}

MISMATCH = declare("custom-gradient-mismatch", CUSTOM_AUTOGRAD, "error",
                   "a custom autograd Function's backward disagrees with finite differences on real inputs",
                   thresholds={"ATOL": ATOL, "RTOL": RTOL, "EPS": EPS, "EPS_CONFIRM": EPS_CONFIRM})
SURROGATE = declare("custom-function-surrogate-gradient", CUSTOM_AUTOGRAD, "info",
                    "a piecewise-constant forward with a deliberate surrogate gradient "
                    "(straight-through estimator)")
BAD_RETURN = declare("custom-function-bad-grad-return", CUSTOM_AUTOGRAD, "error",
                     "backward returns the wrong number, shape or device of gradients")
DIRTY = declare("custom-function-dirty-input", CUSTOM_AUTOGRAD, "warning",
                "forward modifies an input in place without ctx.mark_dirty")
CTX_TENSORS = declare("custom-function-ctx-tensors", CUSTOM_AUTOGRAD, "warning",
                      "tensors kept as ctx attributes instead of ctx.save_for_backward")


def _calls(ev: Evidence) -> dict[str, list[dict[str, Any]]]:
    if not ev.has("gradcheck_summary"):
        raise NotApplicable("the autograd capture did not report (the run ended before it could)")
    if not ev.of("autograd_function"):
        raise NotApplicable("no custom torch.autograd.Function was called in the run")
    err = (ev.last("gradcheck_summary") or {}).get("error")
    if err and not ev.of("gradcheck_call"):
        raise NotApplicable(f"the checks could not run after the script: {err}")
    by: dict[str, list[dict[str, Any]]] = {}
    for c in ev.of("gradcheck_call"):
        by.setdefault(str(c.get("function")), []).append(c)
    return by


def input_name(call: dict[str, Any], arg: int) -> str:
    names = call.get("input_names") or []
    return f"{names[arg]} (input {arg})" if arg < len(names) else f"input {arg}"


def _wrong(inp: dict[str, Any]) -> bool:
    return bool(inp.get("confirmed")) and (inp.get("gradcheck") or {}).get("passed") is not True


def _surrogate(inp: dict[str, Any]) -> bool:
    return _wrong(inp) and bool(inp.get("numerical_zero")) and inp.get("forward_varies") is True


def _shapes(call: dict[str, Any]) -> str:
    sh = [s for s in (call.get("shapes") or []) if s is not None]
    return " ".join(str(s).replace(" ", "") for s in sh)


def _call_label(call: dict[str, Any]) -> str:
    site = short_path(call.get("call_site"))
    return f"call {call.get('call')} ({_shapes(call)}{', at ' + site if site else ''})"


def _present(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v not in (None, [], "")}


def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


# ---------------------------------------------------------------------------- gradient mismatch
@rule("custom-gradient-mismatch", probes=PROBES,
      needs={"gradcheck_call", "gradcheck_summary", "autograd_function"}, raises=[MISMATCH])
def gradient_mismatch(ev: Evidence) -> list[Finding]:
    by = _calls(ev)
    checked = {f: [c for c in cs if c.get("status") == "checked"] for f, cs in by.items()}
    if not any(checked.values()):
        reasons = sorted({str(c.get("reason")) if c.get("reason") else
                          "the backward raised in float64" if c.get("status") == "backward-error" else
                          str(c.get("status")) for cs in by.values() for c in cs})
        raise NotApplicable("no captured call could be checked" + (": " + "; ".join(reasons[:3]) if reasons else
                                                                  " (no call built a graph)"))
    out = []
    for fn, calls in checked.items():
        f = _first_order(fn, calls) or _second_order(fn, calls)
        if f is not None:
            out.append(f)
    return out


def _first_order(fn: str, calls: list[dict[str, Any]]) -> Finding | None:
    wrong_calls = [c for c in calls if any(_wrong(i) and not _surrogate(i) for i in c.get("inputs", []))]
    if not wrong_calls:
        return None
    worst_call, worst = None, None
    wrong_args: list[int] = []
    for c in wrong_calls:
        for i in c.get("inputs", []):
            if _wrong(i) and not _surrogate(i):
                if i["arg"] not in wrong_args:
                    wrong_args.append(i["arg"])
                if worst is None or (i.get("max_abs_error") or 0) > (worst.get("max_abs_error") or 0):
                    worst_call, worst = c, i
    checked_args = sorted({i["arg"] for c in calls for i in c.get("inputs", [])})
    correct = [a for a in checked_args if a not in wrong_args]
    w = worst.get("worst") or {}
    name = input_name(worst_call, worst["arg"])
    none_for = [input_name(worst_call, i["arg"]) for c in wrong_calls for i in c.get("inputs", [])
                if i.get("returned_none") and _wrong(i)]
    evidence: dict[str, Any] = {
        "function": fn,
        "wrong_inputs": [input_name(worst_call, a) for a in wrong_args],
        "correct_inputs": [input_name(worst_call, a) for a in correct],
        "max_abs_error": worst.get("max_abs_error"), "max_rel_error": worst.get("max_rel_error"),
        "worst_element": {"input": name, "index": w.get("index"), "analytical": w.get("analytical"),
                          "numerical": w.get("numerical")},
        "elements": (f"{worst.get('confirmed')} of {worst.get('compared')} compared elements disagree"
                     + (f" (sampled from {worst.get('elements')})" if worst.get("sampled") else "")),
        "backward_at": short_path(worst_call.get("backward_at")),
        "call_site": short_path(worst_call.get("call_site")),
        "wrong_on": [_call_label(c) for c in wrong_calls],
    }
    right = [c for c in calls if c not in wrong_calls]
    if right:
        evidence["correct_on"] = [_call_label(c) for c in right]
    if none_for:
        evidence["backward_returned_none_for"] = sorted(set(none_for))
    red = worst_call.get("reduced")
    if red:
        evidence["checked_on"] = f"the first {red['dim0'][1]} of {red['dim0'][0]} rows of the real call"
    gc = worst.get("gradcheck") or {}
    if gc.get("passed") is False:
        evidence["torch_gradcheck"] = f"failed for {name} (the other inputs held constant)"
    which = f"{len(wrong_calls)} of {len(calls)} checked calls"
    title = (f"{fn}.backward returns a wrong gradient for {name}: analytical {_fmt(w.get('analytical'))} "
             f"vs numerical {_fmt(w.get('numerical'))} at element {w.get('index')} "
             f"(max abs error {_fmt(worst.get('max_abs_error'))}, rel {_fmt(worst.get('max_rel_error'))}) "
             f"on {which}")
    if name in none_for:
        title += " (backward returns None for it: a zero gradient)"
    if correct:
        title += f"; its gradient for {', '.join(evidence['correct_inputs'])} is correct"
    at = evidence["backward_at"]
    return finding("custom-gradient-mismatch", title, _present(evidence), fix=(
        f"Re-derive the gradient of {name} in {fn}.backward{' (' + at + ')' if at else ''}: "
        "compare term by term with the forward (a dropped factor, a missing chain-rule term, a "
        "transposed matrix, a sum over the wrong dim); then confirm with "
        "torch.autograd.gradcheck(F.apply, inputs) on small float64 inputs"))


def _second_order(fn: str, calls: list[dict[str, Any]]) -> Finding | None:
    bad = [c for c in calls if (c.get("gradgradcheck") or {}).get("passed") is False]
    if not bad:
        return None
    c = bad[0]
    msg = str((c.get("gradgradcheck") or {}).get("message") or "").splitlines()
    evidence = {"function": fn, "order": 2, "torch_gradgradcheck": msg[0] if msg else None,
                "backward_at": short_path(c.get("backward_at")), "call_site": short_path(c.get("call_site")),
                "wrong_on": [_call_label(x) for x in bad], "first_order": "correct on every checked call"}
    title = (f"{fn}: the first-order gradients are correct but double backward (differentiating "
             f"its backward) disagrees with finite differences on {len(bad)} of {len(calls)} checked calls")
    return finding("custom-gradient-mismatch", title, _present(evidence), severity="warning", fix=(
        "If the script differentiates through this backward (gradient penalty, create_graph=True, "
        "higher-order methods), write backward with differentiable ops on saved tensors (no .detach(), "
        ".data or in-place); otherwise decorate backward with "
        "@torch.autograd.function.once_differentiable so double backward raises instead"))


# ---------------------------------------------------------------------------- surrogate gradient
@rule("custom-function-surrogate-gradient", probes=PROBES,
      needs={"gradcheck_call", "gradcheck_summary", "autograd_function"}, raises=[SURROGATE])
def surrogate_gradient(ev: Evidence) -> list[Finding]:
    out = []
    for fn, calls in _calls(ev).items():
        checked = [c for c in calls if c.get("status") == "checked"]
        args: dict[int, list] = {}
        for c in checked:
            for i in c.get("inputs", []):
                args.setdefault(i["arg"], []).append((c, i))
        ste = [a for a, items in args.items() if all(_surrogate(i) for _, i in items)]
        if not ste:
            continue
        c, i = args[ste[0]][0]
        names = [input_name(c, a) for a in ste]
        evidence = {"function": fn, "inputs": names, "numerical_gradient": "zero on every compared element",
                    "analytical_max": i.get("max_analytical"),
                    "backward_at": short_path(c.get("backward_at")), "call_site": short_path(c.get("call_site"))}
        out.append(finding("custom-function-surrogate-gradient",
                           f"{fn} is a straight-through estimator for {', '.join(names)}: its forward is "
                           "piecewise constant (numerical gradient zero) and backward returns a surrogate "
                           "gradient, deliberately not the derivative", _present(evidence),
                           fix="Nothing to fix if the surrogate is intended (quantization, binarization, "
                               "spiking, hard routing); its gradient cannot be checked numerically"))
    return out


# ---------------------------------------------------------------------------- returned gradients
KIND_TEXT = {"count": "the wrong number of gradients", "shape": "a gradient of the wrong shape",
             "device": "a gradient on the wrong device", "dtype": "a gradient of the wrong dtype",
             "layout": "a gradient of the wrong layout",
             "not-a-tensor": "a gradient for an input that is not a tensor"}


@rule("custom-function-bad-grad-return", probes=PROBES,
      needs={"gradcheck_call", "gradcheck_summary", "autograd_function"}, raises=[BAD_RETURN])
def bad_grad_return(ev: Evidence) -> list[Finding]:
    out, seen = [], set()
    for fn, calls in _calls(ev).items():
        for c in calls:
            if c.get("status") != "backward-error" or fn in seen:
                continue
            r = c.get("returns") or classify(c.get("error") or "")
            if not r:
                continue
            seen.add(fn)
            evidence = {"function": fn, "kind": r.get("kind"), "torch_error": str(c.get("error"))[:400],
                        "forward_inputs": c.get("input_names") or None,
                        "backward_at": short_path(c.get("backward_at")),
                        "call_site": short_path(c.get("call_site"))}
            detail = _return_detail(c, r)
            out.append(finding("custom-function-bad-grad-return",
                               f"{fn}.backward returns {KIND_TEXT.get(r.get('kind'), 'a wrong gradient')}: "
                               f"{detail}", _present(evidence),
                               fix=("Return exactly one value per forward input, in order (None for inputs "
                                    "that need no gradient, e.g. non-tensor arguments), each with the "
                                    "shape, dtype and device of its input (sum over broadcast dims)")))
    return out


def _return_detail(c: dict[str, Any], r: dict[str, Any]) -> str:
    k = r.get("kind")
    if k == "count":
        names = c.get("input_names") or []
        return (f"{r.get('got')} returned for {r.get('expected')} forward inputs"
                + (f" ({', '.join(names)})" if names else ""))
    if k == "shape":
        return (f"{input_name(c, int(r.get('index', 0)))} got {r.get('got')}, its input is "
                f"{r.get('expected')}")
    if k == "not-a-tensor":
        pos = int(r.get("position", 1)) - 1
        return f"a non-None value for {input_name(c, pos)}, which is not a tensor"
    return f"{input_name(c, int(r.get('index', 0)))}: expected {r.get('expected')}, got {r.get('got')}"


# ---------------------------------------------------------------------------- misuse in forward
def _library_note(record: dict, evidence: dict) -> bool:
    """True when the Function is a library's (not the script's files): said in the evidence."""
    lib = record.get("user_code") is False
    if lib:
        evidence["note"] = "the Function is defined in a library, not in the script's files"
    return lib


@rule("custom-function-dirty-input", probes=PROBES, needs={"autograd_dirty", "autograd_function"},
      raises=[DIRTY])
def dirty_input(ev: Evidence) -> list[Finding]:
    if not ev.of("autograd_function"):
        raise NotApplicable("no custom torch.autograd.Function was called in the run")
    out = []
    names = {e.get("function"): e.get("inputs") or [] for e in ev.of("autograd_function")}
    for d in ev.of("autograd_dirty"):
        fn = d.get("function")
        call = {"input_names": names.get(fn)}
        name = input_name(call, int(d.get("arg") or 0))
        what = "a leaf tensor that requires grad (a parameter?)" if d.get("leaf") else "a tensor in the graph"
        evidence = {"function": fn, "input": name, "shape": d.get("shape"), "is": what,
                    "forward_at": short_path(d.get("forward_at")), "call_site": short_path(d.get("call_site")),
                    "first_seen_on_call": d.get("call")}
        lib = _library_note(d, evidence)
        out.append(finding("custom-function-dirty-input",
                           f"{fn}.forward modifies {name} in place without ctx.mark_dirty: autograd "
                           f"does not know the value changed ({what})"
                           + (" (in a library's Function)" if lib else ""), _present(evidence),
                           severity="info" if lib else None,
                           fix=("Call ctx.mark_dirty(x) for an input modified in place and return it; "
                                "or work on a copy (x = x.clone()) in forward")))
    return out


@rule("custom-function-ctx-tensors", probes=PROBES, needs={"autograd_ctx_tensors", "autograd_function"},
      raises=[CTX_TENSORS])
def ctx_tensors(ev: Evidence) -> list[Finding]:
    if not ev.of("autograd_function"):
        raise NotApplicable("no custom torch.autograd.Function was called in the run")
    out = []
    for e in ev.of("autograd_ctx_tensors"):
        attrs = e.get("attrs") or []
        graph = [a for a in attrs if a.get("role") != "intermediate"]
        listed = ", ".join(f"ctx.{a.get('name')} ({a.get('role')})" for a in attrs[:6])
        evidence = {"function": e.get("function"), "attributes": listed,
                    "shapes": {str(a.get("name")): a.get("shape") for a in attrs[:6]},
                    "forward_at": short_path(e.get("forward_at")), "backward_at": short_path(e.get("backward_at")),
                    "call_site": short_path(e.get("call_site"))}
        cycle = any(str(a.get("role", "")).startswith(("output", "view of output")) for a in graph)
        why = ("an output kept on its own ctx is a reference cycle that keeps the graph alive; "
               if cycle else "") + (
               "in-place changes go unchecked and saved-tensor hooks (checkpointing, offloading) "
               "do not see them" if graph else
               "saved-tensor hooks (checkpointing, offloading) do not see them")
        lib = _library_note(e, evidence)
        out.append(finding("custom-function-ctx-tensors",
                           f"{e.get('function')}.forward keeps tensors as ctx attributes instead of "
                           f"ctx.save_for_backward: {listed}; {why}"
                           + (" (in a library's Function)" if lib else ""), _present(evidence),
                           severity=None if graph and not lib else "info",
                           fix=("Save tensors with ctx.save_for_backward(...) and read them with "
                                "ctx.saved_tensors in backward; keep only non-tensors (shapes, flags) "
                                "as ctx attributes")))
    return out


# ---------------------------------------------------------------------------- torch.library ops
OPCHECK = declare("custom-op-check-failed", CUSTOM_AUTOGRAD, "warning",
                  "torch.library.opcheck fails for a custom op on a real call (schema, autograd "
                  "registration, fake implementation)")
OPCHECK_WARN = ("test_schema", "test_autograd_registration")  # wrong results or gradients in eager too


@rule("custom-op-check-failed", probes=PROBES, needs={"gradcheck_call", "gradcheck_summary",
                                                      "autograd_function"}, raises=[OPCHECK])
def custom_op_check(ev: Evidence) -> list[Finding]:
    ops = [c for c in ev.of("gradcheck_call") if c.get("opcheck")]
    if not ops:
        if not any(f.get("is_op") for f in ev.of("autograd_function")):
            raise NotApplicable("no torch.library custom op was called (or none with a graph)")
        raise NotApplicable("opcheck did not run (the check budget was spent)")
    out = []
    for c in ops:
        failed = {k: v for k, v in c["opcheck"].items() if v != "SUCCESS"}
        if not failed:
            continue
        warn = any(k in OPCHECK_WARN for k in failed)
        evidence = {"op": c.get("function"), "failed": failed, "defined_at": short_path(c.get("forward_at")),
                    "call_site": short_path(c.get("call_site")),
                    "passed": sorted(k for k, v in c["opcheck"].items() if v == "SUCCESS")}
        what = ", ".join(sorted(failed))
        title = (f"torch.library.opcheck fails for {c.get('function')} on a real call: {what}"
                 + ("" if warn else " (only torch.compile / export tracing is affected)"))
        out.append(finding("custom-op-check-failed", title, _present(evidence),
                           severity=None if warn else "info",
                           fix=("test_schema: declare every argument the op mutates in mutates_args and "
                                "return no alias of an input; test_autograd_registration: register the "
                                "backward with op.register_autograd (not an autograd.Function inside the "
                                "kernel); test_faketensor: add op.register_fake returning empty tensors of "
                                "the output shapes")))
    return out
