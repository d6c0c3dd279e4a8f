"""torch.compile rules: graph breaks, recompiles, the recompile limit, no compile at all.

Evidence: the ``dynamo_diag`` instrument (dynamo's own graph-break and recompile messages,
its compile records, the steps that compiled) and ``dynamo_counters`` (its counters at the end),
read by :mod:`torchdoctor.compilecheck.summary`. How they decide (thresholds below; why:
docs/findings/<code>.md):

* compile-graph-break: dynamo broke the graph at a user line (any break seen): one finding,
  the sites by file:line; a site where dynamo skipped the whole frame (the function runs eager)
  comes first and says so;
* compile-recompiles: a function recompiled ≥ RECOMPILES_MIN times without reaching the limit
  (one recompile is what ``dynamic`` shape marking and a train/eval switch cost);
* compile-recompile-limit (error): dynamo hit its recompile limit for a function: from then on
  it runs eager; the step, the guard and the step times before/after are given;
* compile-not-used (info, probe ``compile``): the script never reached torch.compile;
* compile-in-use (info, probe ``checkup``): the model is compiled; dynamo's counters and a
  pointer to ``torchdoctor compile`` (a warning only when the counters show the limit was hit).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.compilecheck import summary as cs
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import PERFORMANCE

RECOMPILES_MIN = 3
MAX_SITES = 8
DIAG = {"dynamo_break", "dynamo_recompile", "dynamo_limit", "dynamo_compile", "dynamo_step",
        "dynamo_counters", "step"}

GRAPH_BREAK = declare("compile-graph-break", PERFORMANCE, "warning",
                      "torch.compile broke the graph (or skipped a whole function) at a line of yours")
RECOMPILES = declare("compile-recompiles", PERFORMANCE, "warning",
                     "a compiled function is recompiled again and again",
                     thresholds={"RECOMPILES_MIN": RECOMPILES_MIN})
RECOMPILE_LIMIT = declare("compile-recompile-limit", PERFORMANCE, "error",
                          "dynamo hit its recompile limit: the function runs eager from then on")
NOT_USED = declare("compile-not-used", PERFORMANCE, "info",
                   "the script does not call torch.compile")
IN_USE = declare("compile-in-use", PERFORMANCE, "info",
                 "the model is compiled (dynamo's counters); torchdoctor compile has the detail")

RECOMPILE_FIX = ("Find the value in the guard and stop it changing under the compiled code: "
                 "a Python number or flag read in forward that changes every step "
                 "(an attribute, a global) is baked into the graph — pass it as a tensor "
                 "argument, or move that state out of forward; a changing tensor shape: "
                 "torch._dynamo.mark_dynamic(x, dim) before the call, or torch.compile(..., "
                 "dynamic=True); an int attribute of an nn.Module: "
                 "torch._dynamo.config.allow_unspec_int_on_nn_module = True")


def _short(loc: str | None) -> str | None:
    return short_path(loc) if loc else loc


def _need_dynamo(ev: Evidence) -> None:
    c = ev.last("dynamo_counters") or {}
    if not (c.get("frames") or ev.of("dynamo_compile") or ev.of("dynamo_break")):
        raise NotApplicable("torch.compile was not used in this run")


@rule("compile-graph-break", probes={"compile"}, needs=DIAG, raises=[GRAPH_BREAK])
def compile_graph_break(ev: Evidence) -> list[Finding]:
    _need_dynamo(ev)
    sites = cs.break_sites(ev)
    if not sites:
        return []
    rows = []
    for s in sites[:MAX_SITES]:
        rows.append({"where": _short(s["where"]), "reason": s.get("reason"), "break": s.get("what"),
                     "id": s.get("gb"), "docs": s.get("url"), "times": s["count"],
                     "whole_function_eager": s["skip"], "first_step": s.get("first_step"),
                     "hint": s.get("hint")})
    top = sites[0]
    skipped = [s for s in sites if s["skip"]]
    where = _short(top["where"])
    if skipped:
        title = (f"graph break at {where} made dynamo skip the whole function: it runs eager "
                 f"({top.get('reason') or top.get('what') or 'unsupported code'})")
    else:
        title = (f"{len(sites)} graph break site(s); first at {where}: "
                 f"{top.get('reason') or top.get('what') or 'unsupported code'}")
    ev_out: dict[str, Any] = {"sites": rows, "break_sites": len(sites),
                              "functions_run_eager": len(skipped)}
    fix = ("Remove the break from the compiled code: " + (top.get("hint") or "")
           + (" A graph break inside a for/while loop makes dynamo give up on the whole "
              "function: move the data-dependent Python decision (.item(), a print, a "
              "numpy call) out of the loop or out of forward, or use torch.where / "
              "torch.cond to keep it in the graph." if skipped else
              " Each break splits the graph in two and costs a round trip to Python; move "
              "the Python-side work (.item(), print, numpy, logging) out of forward.")
           + " See the page of each break id (docs).")
    return [finding("compile-graph-break", title, ev_out, fix=fix.strip())]


@rule("compile-recompiles", probes={"compile"}, needs=DIAG, raises=[RECOMPILES])
def compile_recompiles(ev: Evidence) -> list[Finding]:
    _need_dynamo(ev)
    limited = {h["where"] for h in cs.limit_hits(ev)}
    out = []
    for f in cs.recompiled_functions(ev):
        if f["count"] < RECOMPILES_MIN or f["where"] in limited:
            continue
        guard = f["guards"][0] if f["guards"] else "an unknown guard"
        line = _short(f["user_line"] or f["where"])
        out.append(finding(
            "compile-recompiles",
            f"{f['function']} recompiled {f['count']} times: guard `{guard}` failed ({line})",
            {"function": f["function"], "defined_at": _short(f["where"]), "read_at": _short(f["user_line"]),
             "recompiles": f["count"], "guards": f["guards"], "steps": f["steps"][:20]},
            fix=RECOMPILE_FIX))
    return out


@rule("compile-recompile-limit", probes={"compile"}, needs=DIAG, raises=[RECOMPILE_LIMIT])
def compile_recompile_limit(ev: Evidence) -> list[Finding]:
    _need_dynamo(ev)
    out = []
    funcs = {f["where"]: f for f in cs.recompiled_functions(ev)}
    for h in cs.limit_hits(ev):
        f = funcs.get(h["where"]) or {}
        guard = h.get("guard") or (f.get("guards") or [None])[-1] or "an unknown guard"
        line = _short(h.get("user_line") or f.get("user_line") or h["where"])
        step = h.get("step")
        times = cs.around(ev, int(step)) if step is not None else {}
        limit = f"{h['limit']} ({h['value']})" if h.get("limit") else "the recompile limit"
        title = (f"{h.get('function') or 'a function'} hit {limit} at step {step}: it runs eager "
                 f"from then on; guard `{guard}` failed ({line}), "
                 f"{f.get('count') or 'several'} recompiles before")
        out.append(finding(
            "compile-recompile-limit", title,
            {"function": h.get("function"), "defined_at": _short(h["where"]), "read_at": line,
             "guard": guard, "guards": f.get("guards", []), "recompiles": f.get("count"),
             "limit": h.get("limit"), "limit_value": h.get("value"), "step": step,
             "step_ms_before": times.get("before_ms"), "steps_before": times.get("before_steps"),
             "step_ms_after": times.get("after_ms"), "steps_after": times.get("after_steps"),
             "before_includes_compile": True},
            fix=RECOMPILE_FIX + ". Raising torch._dynamo.config.recompile_limit only delays it."))
    return out


@rule("compile-not-used", probes={"compile"}, needs=DIAG, raises=[NOT_USED])
def compile_not_used(ev: Evidence) -> list[Finding]:
    c = ev.last("dynamo_counters")
    if c is None:
        raise NotApplicable("dynamo's counters were not read (the run ended early)")
    if not ev.of("step"):
        raise NotApplicable("no training step was seen")
    if c.get("frames") or ev.of("dynamo_compile") or ev.of("dynamo_break"):
        return []
    if c.get("disabled"):
        return [finding("compile-not-used", "torch.compile is switched off in this environment "
                        "(TORCHDYNAMO_DISABLE / TORCH_COMPILE_DISABLE)", {"disabled": True},
                        fix="Unset TORCHDYNAMO_DISABLE and TORCH_COMPILE_DISABLE to compile.")]
    return [finding(
        "compile-not-used", "the script does not call torch.compile: nothing was compiled",
        {"steps_seen": len(ev.of("step")), "dynamo_imported": bool(c.get("loaded"))},
        fix="To measure what compiling would give, run `torchdoctor treat --try compile "
            "SCRIPT`: it compiles the model from outside and compares the step time and "
            "the loss with the script as it is.")]


@rule("compile-in-use", probes={"checkup"}, needs={"dynamo_counters"}, raises=[IN_USE])
def compile_in_use(ev: Evidence) -> list[Finding]:
    c = ev.last("dynamo_counters")
    if c is None:
        raise NotApplicable("dynamo's counters were not read")
    if not c.get("frames"):
        return []
    limit = bool(c.get("limit_hit"))
    title = (f"the model is compiled: {c.get('graphs', 0)} graph(s), {c.get('graph_breaks', 0)} "
             f"graph break(s), {c.get('recompiles', 0)} recompile(s)"
             + (", and dynamo hit its recompile limit (a function runs eager)" if limit else ""))
    return [finding(
        "compile-in-use", title,
        {k: c.get(k) for k in ("frames", "frames_ok", "graphs", "graph_breaks", "recompiles",
                               "limit_hit", "compile_s")},
        fix="Run `torchdoctor compile SCRIPT` for the line of each graph break and the guard "
            "of each recompile, and the measured speed-up over eager.",
        severity="warning" if limit else None)]
