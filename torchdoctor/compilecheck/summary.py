"""The dynamo evidence of one run, read into what the rules and the JSON ``compile`` section use.

Pure (Evidence in, plain data out; no torch). Definitions:

* **break sites**: the ``dynamo_break`` events grouped by the user's file:line (count = how many
  times dynamo met the break while compiling: once per compile of that code); a site is
  ``skip`` when dynamo said it skipped the frame, or when a compile record of a frame failed at
  that line without keeping compiled code (the whole function then runs eager);
* **recompiled functions**: ``dynamo_recompile`` events grouped by function (file, first line),
  with their distinct failed guards and the user line that reads the guarded value; when the
  log channel gave nothing, the compile records' recompile reasons;
* **the recompile limit**: a ``dynamo_limit`` event, else a compile record that failed with
  dynamo's "recompile limit" title;
* **compile steps**: the steps in which something was compiled (``dynamo_step``): their time is
  compile time, left out of every step-time figure here;
* **steady step time**: the median of the judged steps (warm-up left out) that did not compile.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchdoctor.evidence import Evidence

LIMIT_TEXT = "recompile limit"
MAX_GUARDS = 5


def _loc(file: Any, line: Any) -> str | None:
    if not file:
        return None
    return f"{file}:{line}" if line is not None else str(file)


def compile_steps(ev: Evidence) -> list[int]:
    return sorted({int(e["step"]) for e in ev.of("dynamo_step") if e.get("step") is not None})


def _median_ms(ev: Evidence, steps: list[dict[str, Any]]) -> float | None:
    """Median step time by the one step-time basis (on CUDA: host wall or device span)."""
    from torchdoctor.evidence.steps import step_seconds

    walls = step_seconds(ev, [s for s in steps if s.get("wall_s") is not None])[0]
    return round(statistics.median(walls) * 1e3, 3) if walls else None


def steady_steps(ev: Evidence) -> list[dict[str, Any]]:
    """The judged steps (warm-up left out) in which nothing was compiled."""
    from torchdoctor.evidence.steps import judged_steps

    skip = set(compile_steps(ev))
    return [s for s in judged_steps(ev) if int(s.get("step", 0)) not in skip]


def break_sites(ev: Evidence) -> list[dict[str, Any]]:
    sites: dict[str, dict[str, Any]] = {}
    for e in ev.of("dynamo_break"):
        loc = _loc(e.get("file"), e.get("line"))
        if loc is None:
            continue
        s = sites.setdefault(loc, {"where": loc, "count": 0, "skip": False, "first_step": e.get("step"),
                                   "reason": None, "what": None, "hint": None, "gb": None, "url": None})
        s["count"] += 1
        s["skip"] = s["skip"] or bool(e.get("skip"))
        for k in ("reason", "what", "hint", "gb", "url"):
            if s[k] is None and e.get(k):
                s[k] = e[k]
    for r in ev.of("dynamo_compile"):  # a frame that failed and kept no compiled code: skipped
        if not r.get("fail") or r.get("guarded") or LIMIT_TEXT in str(r.get("fail_reason") or "").lower():
            continue
        loc = _loc(r.get("fail_file"), r.get("fail_line"))
        if loc is None:
            continue
        s = sites.setdefault(loc, {"where": loc, "count": 1, "skip": True, "first_step": r.get("step"),
                                   "reason": r.get("fail_reason"), "what": r.get("fail_reason"),
                                   "hint": None, "gb": r.get("fail_gb"), "url": r.get("fail_url")})
        s["skip"] = True
        s["function"] = r.get("function")
    return sorted(sites.values(), key=lambda s: (not s["skip"], -s["count"], s["where"]))


def recompiled_functions(ev: Evidence) -> list[dict[str, Any]]:
    funcs: dict[str, dict[str, Any]] = {}
    events = ev.of("dynamo_recompile")
    if not events:  # dynamo logs recompiles only under TORCH_LOGS: its compile records' reasons
        events = [{"step": r.get("step"), "function": r.get("function"), "file": r.get("file"),
                   "line": r.get("line"), "guard": r.get("recompile_guard"),
                   "user_file": r.get("recompile_file"), "user_line": r.get("recompile_line")}
                  for r in ev.of("dynamo_compile")
                  if r.get("recompile_guard") and (r.get("file") or r.get("function"))]
    for e in events:
        key = _loc(e.get("file"), e.get("line")) or str(e.get("function"))
        f = funcs.setdefault(key, {"function": e.get("function"), "where": key, "count": 0,
                                   "guards": [], "user_line": None, "steps": []})
        f["count"] += 1
        g = e.get("guard")
        if g and g not in f["guards"] and len(f["guards"]) < MAX_GUARDS:
            f["guards"].append(g)
        if f["user_line"] is None and e.get("user_file"):
            f["user_line"] = _loc(e.get("user_file"), e.get("user_line"))
        if e.get("step") is not None:
            f["steps"].append(int(e["step"]))
    return sorted(funcs.values(), key=lambda f: -f["count"])


def limit_hits(ev: Evidence) -> list[dict[str, Any]]:
    """One entry per function that hit the recompile limit (first time), with its step."""
    hits: dict[str, dict[str, Any]] = {}
    for e in ev.of("dynamo_limit"):
        key = _loc(e.get("file"), e.get("line")) or str(e.get("function"))
        hits.setdefault(key, {"where": key, "function": e.get("function"), "step": e.get("step"),
                              "limit": e.get("limit"), "value": e.get("value"), "guard": e.get("guard"),
                              "user_line": _loc(e.get("user_file"), e.get("user_line"))})
    for r in ev.of("dynamo_compile"):
        if LIMIT_TEXT in str(r.get("fail_reason") or "").lower():
            key = _loc(r.get("file"), r.get("line")) or str(r.get("function"))
            if not hits:  # the warning was not captured: the record says it
                hits.setdefault(key, {"where": key, "function": r.get("function"),
                                      "step": r.get("step"), "limit": None, "value": None,
                                      "guard": r.get("recompile_guard"), "user_line": None})
    return list(hits.values())


def around(ev: Evidence, step: int) -> dict[str, Any]:
    """Median step ms before ``step`` (those steps compiled: their time includes it) and after
    it (steps that compiled nothing), with how many steps each side has."""
    from torchdoctor.evidence.steps import judged_steps

    skip = set(compile_steps(ev))
    js = judged_steps(ev)
    before = [s for s in js if int(s.get("step", 0)) < step]
    after = [s for s in js if int(s.get("step", 0)) > step and int(s.get("step", 0)) not in skip]
    return {"before_ms": _median_ms(ev, before), "before_steps": len(before),
            "after_ms": _median_ms(ev, after), "after_steps": len(after)}


def summarize(ev: Evidence) -> dict[str, Any] | None:
    """The ``compile`` section (None when the run has no dynamo evidence at all)."""
    c = ev.last("dynamo_counters")
    if c is None and not ev.of("dynamo_compile") and not ev.of("dynamo_step"):
        return None
    c = c or {}
    records = ev.of("dynamo_compile")
    secs = sum(float(r.get("seconds") or 0.0) for r in records)
    steps = compile_steps(ev)
    steady = steady_steps(ev)
    out: dict[str, Any] = {
        "compiled": bool(c.get("frames") or records),
        "graphs": c.get("graphs"),
        "frames": c.get("frames"),
        "frames_compiled": c.get("frames_ok"),
        "graph_breaks": len(break_sites(ev)) if ev.of("dynamo_break") or records else c.get("graph_breaks"),
        "recompiles": sum(f["count"] for f in recompiled_functions(ev)) if records or
        ev.of("dynamo_recompile") else c.get("recompiles"),
        "recompile_limit_hit": bool(limit_hits(ev)) or bool(c.get("limit_hit")),
        "compile_s": round(secs, 3) if records else c.get("compile_s"),
        "compile_steps": steps,
        "steady_steps": len(steady),
        "compiled_step_ms": _median_ms(ev, steady) if (c.get("frames") or records) else None,
    }
    return out
