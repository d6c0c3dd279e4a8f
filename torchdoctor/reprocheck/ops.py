"""Two op traces compared op by op: the first op whose inputs or outputs differ.

Input: the ``op_trace`` events of the localising pair (``instruments/repro/fingerprint_ops.py``), the
ops of the divergent step (from start-up when it is step 1) in execution order. The first op
that differs is classified:

* ``nondeterministic``: the same op, fingerprints of its tensor inputs and its number arguments
  equal, outputs different, and not an op that draws random numbers: the op itself gave two
  results for one input;
* ``random``: an op that draws from torch's generator (``RANDOM_OPS``) with equal inputs and
  different outputs: the generator's state differed;
* ``inputs``: the op's inputs already differ while every earlier op agreed: the values came from
  outside torch's ops (Python or NumPy numbers, a tensor built from them);
* ``control-flow``: the two runs ran different ops (a different branch or shape).
"""

from __future__ import annotations

from typing import Any

# aten ops that draw from a torch generator (overload packet names)
RANDOM_OPS = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "random_", "multinomial", "poisson", "native_dropout", "dropout",
    "feature_dropout", "alpha_dropout", "rrelu_with_noise", "_fused_dropout", "_standard_gamma",
    "binomial", "_sample_dirichlet"})


def _op(trace: dict[str, Any], i: int) -> dict[str, Any]:
    name, phase, mi, wi = trace["ops"][i][:4]
    strings = trace.get("strings") or []
    return {"op": name, "phase": phase,
            "module": strings[mi] if mi < len(strings) else "",
            "where": strings[wi] if wi < len(strings) else "", "index": i}


def first_divergent_op(ta: dict[str, Any] | None, tb: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first differing op (see the module doc), or None when the traces agree. A missing
    trace gives {"kind": "unavailable"}."""
    if not ta or not tb:
        return {"kind": "unavailable", "reason": "a localising run recorded no op trace"}
    oa, ob = ta.get("ops") or [], tb.get("ops") or []
    for i, (a, b) in enumerate(zip(oa, ob)):
        if a[0] != b[0]:
            out = _op(ta, i)
            out.update(kind="control-flow", op_b=b[0])
            return out
        ins_equal = a[4] == b[4] and (a[6] if len(a) > 6 else "") == (b[6] if len(b) > 6 else "")
        if ins_equal and a[5] == b[5]:
            continue
        out = _op(ta, i)
        if not ins_equal:
            out["kind"] = "inputs"
        elif a[0].rpartition("::")[2] in RANDOM_OPS:
            out["kind"] = "random"
        else:
            out["kind"] = "nondeterministic"
        out["inputs_equal"] = ins_equal
        return out
    cut = stop_note(ta) or stop_note(tb)
    if cut:  # the recorded ops agree, but not every op of the step was recorded
        return {"kind": "unavailable", "reason": f"{cut}; the {min(len(oa), len(ob))} ops recorded agree"}
    if len(oa) != len(ob):
        n = min(len(oa), len(ob))
        longer = ta if len(oa) > len(ob) else tb
        out = _op(longer, n)
        out.update(kind="control-flow", note="one run ran more ops")
        return out
    return None


def stop_note(t: dict[str, Any] | None) -> str:
    """Why an op trace holds only the first ops of its step ("" when it holds them all)."""
    if not t or not t.get("truncated"):
        return ""
    st = t.get("stopped") or {}
    seen = t.get("seen")
    in_all = f" of {seen}" if isinstance(seen, int) else ""
    if st.get("reason") == "memory":
        return (f"localisation stopped at {st.get('grown_mb', 0):.0f} MB (the op trace's budget is "
                f"{st.get('budget_mb')} MB of growth) after {st.get('at_op')}{in_all} ops")
    n = st.get("max_ops") or len(t.get("ops") or [])
    return f"localisation stopped after the first {n}{in_all} ops of the step (the op trace's bound)"


def trace_summary(t: dict[str, Any] | None) -> dict[str, Any] | None:
    if not t:
        return None
    out = {"engine": t.get("engine"), "ops": len(t.get("ops") or []),
           "truncated": bool(t.get("truncated")), "complete": bool(t.get("complete"))}
    if "seen" in t:
        out.update(seen=t.get("seen"), grown_mb=t.get("grown_mb"), stopped=t.get("stopped"),
                   note=stop_note(t) or None)
    return out
