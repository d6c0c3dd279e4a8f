"""Memory rules: memory-growth, memory-fragmentation, grad-in-eval, activation-dominated.

(``out-of-memory`` is declared here, with its family, and raised by the crash rule; the
memory sampler adds its breakdown and allocation sites through a ``crash_context``.)

How they decide (the thresholds are the constants declared with each code below; why these
values: docs/findings/<code>.md, "How it is measured"):
* memory-growth: one judgment for every probe, :func:`torchdoctor.memory.growth.judge`
  (its constants live there, the code declares them): a credible growth (robust slope, rise,
  consistency, still rising at the end) is rated by its impact: error when memory would be
  full within ERROR_HOURS of the measured step time, warning within the HORIZON_HOURS horizon
  (or at a rate >= RATE_WARN_PER_HOUR), info beyond. Not raised when the site window saw the
  growth (>= WINDOW_SEEN of it) but what outlived its step explains less than SURVIVOR_SHARE
  of it (larger steps, no leak); a site whose keeping stopped after the window (STOPPED_SHARE)
  names nothing (rules/memory_steps.py).
* memory-fragmentation: at peak, reserved - allocated >= FRAG_MIN_GAP and >= FRAG_RATIO of
  reserved; or after an OOM, reserved-but-unallocated >= FRAG_MIN_GAP and >= FRAG_OOM_RATIO.
* grad-in-eval: >= GRAD_EVAL_MIN graph-building forwards never backpropagated.
* activation-dominated: activations >= ACT_SHARE of memory at the start of backward and
  >= ACT_MIN_BYTES.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.memory import growth
from torchdoctor.memory.growth import (FIT_MIN_R2, SEVERITY_ORDER, SITE_MIN_SHARE, UNATTRIBUTED_MIN_STEPS,
                                       evidence_cap, judge, with_graph_floor)
from torchdoctor.memory.oom import fix_lines, rank_fixes
from torchdoctor.evidence.memory import cuda_end_stats, memory_series, room_left, step_seconds
from torchdoctor.memory.trend import MIN_POINTS, fit_trend, warmup_count
from torchdoctor.memory.units import MiB, human_bytes
from torchdoctor.rules.memory_steps import (STOPPED_SHARE, SURVIVOR_SHARE, WINDOW_SEEN,
                                            bigger_steps_not_a_leak, stopped_sites, window_sites)
from torchdoctor.skills import TENSOR_MEMORY


FRAG_MIN_GAP = 256 * MiB
FRAG_RATIO = 0.40
FRAG_OOM_RATIO = 0.10

GRAD_EVAL_MIN = 3

ACT_SHARE = 0.5
ACT_MIN_BYTES = 16 * MiB

MEMORY_GROWTH = declare(
    "memory-growth", TENSOR_MEMORY, "error",
    "allocated memory (CUDA) or live tensor bytes (CPU) grows step over step",
    thresholds={**{name: getattr(growth, name) for name in (
        "GROWTH_MIN_SLOPE", "NOISY_MIN_SLOPE", "GROWTH_MIN_RISE", "GROWTH_MIN_CONSISTENCY",
        "GROWTH_LATE_RATIO", "TAIL_MIN_POINTS", "HORIZON_HOURS", "HORIZON_STEPS", "ERROR_HOURS",
        "ERROR_STEPS", "RATE_WARN_PER_HOUR", "UNATTRIBUTED_MIN_STEPS", "FIT_MIN_R2", "SITE_MIN_SHARE")},
        "MIN_POINTS": MIN_POINTS, "WINDOW_SEEN": WINDOW_SEEN, "SURVIVOR_SHARE": SURVIVOR_SHARE,
        "STOPPED_SHARE": STOPPED_SHARE})
OUT_OF_MEMORY = declare(  # raised by the crash rule (rules/crash.py)
    "out-of-memory", TENSOR_MEMORY, "error",
    "the run hit out-of-memory: bytes requested, capacity, what was live")
MEMORY_FRAGMENTATION = declare(
    "memory-fragmentation", TENSOR_MEMORY, "warning",
    "reserved - allocated is large at peak",
    thresholds={"FRAG_MIN_GAP": FRAG_MIN_GAP, "FRAG_RATIO": FRAG_RATIO,
                "FRAG_OOM_RATIO": FRAG_OOM_RATIO})
GRAD_IN_EVAL = declare(
    "grad-in-eval", TENSOR_MEMORY, "warning",
    "forward passes build autograd graphs that are never backpropagated",
    thresholds={"GRAD_EVAL_MIN": GRAD_EVAL_MIN})
ACTIVATION_DOMINATED = declare(
    "activation-dominated", TENSOR_MEMORY, "info",
    "activations dominate peak memory",
    thresholds={"ACT_SHARE": ACT_SHARE, "ACT_MIN_BYTES": ACT_MIN_BYTES})


# ---- memory-growth ------------------------------------------------------------------------

def _site_lines(sites: list[dict[str, Any]], limit: int = 3) -> list[str]:
    out = []
    for s in sites[:limit]:
        fn = f" in {s['function']}" if s.get("function") else ""
        via = f" (called from {', '.join(s['called_from'])})" if s.get("called_from") else ""
        out.append(f"{s['site']}{fn}: {human_bytes(s['bytes_per_step'], signed=True)}/step, "
                   f"{s['count']} allocations kept{via}")
    return out


def _python_note(w: dict[str, Any] | None) -> str | None:
    if w and not w.get("tensor_sites") and w.get("python_sites"):
        return "no tensor outlived its step; the sites are Python-level allocations (tracemalloc)"
    return None


def _sites_for(ev: Evidence, key: str, skip: frozenset[str] = frozenset()
               ) -> tuple[list[str], list[str], str | None, float]:
    """(site lines, graph-growth lines, first site, bytes per step the named sites keep) from the
    allocation-site window; sites in ``skip`` (stopped) name nothing."""
    w = ev.last("mem_sites")
    if not w:
        return [], [], None, 0.0
    sites = [x for x in window_sites(w, key) if x.get("site") not in skip]
    # a lone "(no user frame)" site names nothing: the graph-growth site, when there is one, does
    sites = [s for s in sites if s.get("site") != "(no user frame)"
             or (len(sites) == 1 and not w.get("graph_growth"))]
    graph = [f"{g['site']}{' in ' + g['function'] if g.get('function') else ''}: a tensor made "
             f"here holds an autograd graph growing by {g['nodes_per_step']:g} nodes per step "
             f"({g['graph_nodes']} now)" for g in (w.get("graph_growth") or [])]
    first = sites[0]["site"] if sites else ((w.get("graph_growth") or [{}])[0].get("site"))
    kept = sum(max(0.0, float(s.get("bytes_per_step") or 0)) for s in sites if s.get("site") != "(no user frame)")
    return _site_lines(sites), graph, first, kept


@rule("memory-growth", probes={"memory", "checkup"},
      needs={"mem", "mem_info", "mem_device", "mem_sites", "step"}, raises=[MEMORY_GROWTH])
def memory_growth(ev: Evidence) -> list[Finding]:
    series = memory_series(ev)
    if not series:
        raise NotApplicable("no memory sample at a step boundary (no optimizer step seen)")
    fits = [(s, fit_trend(s.steps, s.values)) for s in series]
    fitted = [(s, f) for s, f in fits if f is not None]
    if not fitted:
        n = max(len(s.steps) for s in series)
        raise NotApplicable(f"needs {MIN_POINTS} steps after the {warmup_count(n)}-step warm-up, "
                            f"saw {n} steps")
    step_s = step_seconds(ev)
    growing = []
    for s, f in fitted:
        v = judge(f, s.noisy, room_left(ev, s), step_s)
        if v.credible and not bigger_steps_not_a_leak(ev, s, f):
            growing.append((s, f, v))
    if not growing:
        return []
    s, fit, verdict = max(growing, key=lambda g: (SEVERITY_ORDER[g[2].severity], g[1].slope))
    return [_growth_finding(ev, s, fit, verdict, growing)]


def _impact_lines(v) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if v.steps_until_full is not None:
        out["steps_until_full"] = v.steps_until_full
    if v.hours_until_full is not None:
        out["hours_until_full"] = round(v.hours_until_full, 2)
    if v.bytes_per_hour is not None:
        out["growth_per_hour"] = human_bytes(v.bytes_per_hour, signed=True)
    out["judged_against"] = v.horizon
    return out


def _when_full(v) -> str:
    if v.hours_until_full is not None:
        h = v.hours_until_full
        return f"full in ~{h * 60:.0f} min" if h < 1 else f"full in ~{h:,.0f} h"
    if v.steps_until_full is not None:
        return f"full in ~{v.steps_until_full:,} steps"
    return ""


def _growth_finding(ev: Evidence, s, fit, verdict, growing) -> Finding:
    stopped, after = stopped_sites(ev, s)
    sites, graph, first, kept = _sites_for(ev, s.key, frozenset(x["site"] for x in stopped))
    fitted_steps = fit.last_step - fit.first_step + 1
    # the site window looked (or was cut) and named nothing that explains the growth: a short run
    # cannot tell a leak from the allocator settling in. Without a window record nothing was tried.
    # A line that explains little of the series is no trend to warn from. A growing graph is a leak.
    looked = ev.last("mem_sites") is not None
    share = kept / fit.slope if fit.slope > 0 else 0.0
    cap = evidence_cap(verdict.severity, fit.r2, fitted_steps, share, bool(graph), looked)
    capped = cap is not None
    if capped:
        verdict = replace(verdict, severity="info")
    floored = bool(graph) and not capped and with_graph_floor(verdict.severity) != verdict.severity
    if floored:
        verdict = replace(verdict, severity=with_graph_floor(verdict.severity))
    ev_out: dict[str, Any] = {
        "series": s.label,
        "growth_per_step": human_bytes(fit.slope, signed=True),
        "bytes_per_step": round(fit.slope),
        "fit_r2": round(fit.r2, 3),
        "steps_fitted": f"{fit.first_step}-{fit.last_step} (first {fit.warmup} left out as warm-up)",
        "grown_over_fit": human_bytes(fit.rise, signed=True),
        **_impact_lines(verdict),
    }
    if cap == "fit":
        ev_out["impact"] = (f"at most info: the fitted line explains {fit.r2:.0%} of the series (R^2 "
                            f"{fit.r2:.2f} < {FIT_MIN_R2:g}): the memory wanders more than it grows "
                            f"steadily, no trend to extrapolate from; run longer to confirm")
    elif capped and sites:
        ev_out["impact"] = (f"at most info: the sites named keep {human_bytes(kept)}/step, "
                            f"{share:.0%} of the fitted growth (less than {SITE_MIN_SHARE:.0%}): they do "
                            f"not explain it, and it was seen over {fitted_steps} steps, fewer than the "
                            f"{UNATTRIBUTED_MIN_STEPS} that tell a leak from the allocator settling in")
    elif capped:
        ev_out["impact"] = (f"at most info: nothing names the growth (no tensor outlived its step, "
                            f"no graph grew, no Python line recorded) and it was seen over "
                            f"{fitted_steps} steps, fewer than the {UNATTRIBUTED_MIN_STEPS} that tell "
                            f"a leak from the allocator settling in; run longer (--steps "
                            f"{max(2 * UNATTRIBUTED_MIN_STEPS, 200)}) to confirm")
    elif floored:
        ev_out["impact"] = ("a warning although memory is not full within the horizon at this rate: an "
                            "autograd graph grows at every step (a kept loss), a leak whatever the rate")
    elif verdict.severity == "info":
        ev_out["impact"] = ("below the threshold of a warning: at this rate memory is not full "
                            "within the horizon; worth a look if the job runs much longer")
    if sites:
        ev_out["growing_sites"] = sites
        note = _python_note(ev.last("mem_sites")) if s.key == "heap" else None
        if note:
            ev_out["sites_note"] = note
    if graph:
        ev_out["graph_growth"] = graph
    if stopped:
        lo, hi = ev.last("mem_sites")["steps"]
        ev_out["stopped_sites"] = [
            f"{x['site']}: kept {human_bytes(x['bytes_per_step'], signed=True)}/step while the site "
            f"window watched (steps {lo}-{hi}); memory after it rises "
            f"{human_bytes(after or 0, signed=True)}/step: it filled, then stopped (not the growth)"
            for x in stopped[:3]]
    others = [f"{o.label}: {human_bytes(f.slope, signed=True)}/step" for o, f, _ in growing if o is not s]
    if others:
        ev_out["also_growing"] = others
    w = ev.last("mem_sites")
    if not sites and not graph:
        if not w:
            ev_out["sites"] = ("not recorded (the growth was not steady, or not fast enough to "
                               "matter, early enough to arm the site window)")
        elif w.get("cut"):
            ev_out["sites"] = f"not recorded: {w['cut']}"
        elif s.key.startswith("cuda"):
            ev_out["sites"] = "no allocation outlived its step in the recorded window"
        else:
            ev_out["sites"] = ("no tensor outlived its step and CPU tensors did not grow: the "
                               "growing memory is outside torch (Python buffers, numpy arrays, "
                               "C extensions)")
    if w and w.get("skipped"):
        ev_out["site_window"] = w["skipped"]
    if not graph and share < SITE_MIN_SHARE:
        first = None  # sites that keep a small share of the growth do not name it
    where = f"; growing site: {first}" if first else ""
    full = _when_full(verdict)
    title = (f"{s.label} grows {human_bytes(fit.slope, signed=True)} per step "
             f"(steps {fit.first_step}-{fit.last_step}{', ' + full if full else ''}){where}")
    if graph:
        fix = ("Accumulate plain numbers, not tensors that require grad: `total += loss.item()` "
               "(or `loss.detach()`); a kept loss tensor holds every step's autograd graph")
    else:
        fix = ("Do not keep tensors across steps: log `loss.item()` / `x.detach().cpu()` instead of "
               "live tensors, clear lists of outputs every epoch, and run evaluation under "
               "`torch.no_grad()`")
    if first:
        fix += f"; start at {first}"
    return finding("memory-growth", title, ev_out, fix=fix, severity=verdict.severity)


# ---- memory-fragmentation -----------------------------------------------------------------

@rule("memory-fragmentation", probes={"memory"}, needs={"mem", "mem_end", "mem_oom", "mem_info"},
      raises=[MEMORY_FRAGMENTATION])
def memory_fragmentation(ev: Evidence) -> list[Finding]:
    stats = cuda_end_stats(ev)
    oom = ev.last("mem_oom")
    if not stats and not oom:
        raise NotApplicable("needs CUDA (the caching allocator's reserved vs allocated bytes)")
    conf = (ev.last("mem_info") or {}).get("alloc_conf") or ""
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    for d, s in sorted(stats.items()):
        pr, pa = int(s.get("peak_reserved", 0)), int(s.get("peak_allocated", 0))
        gap = pr - pa
        if pr and gap >= FRAG_MIN_GAP and gap >= FRAG_RATIO * pr:
            return [_frag(f"cuda:{d}", "at peak", pr, pa, s, expandable)]
    if oom and oom.get("reserved_bytes") and oom.get("allocated_bytes") is not None:
        r, a = int(oom["reserved_bytes"]), int(oom["allocated_bytes"])
        if r - a >= FRAG_MIN_GAP and r - a >= FRAG_OOM_RATIO * r:
            return [_frag(f"cuda:{oom.get('device', 0)}", "when it ran out of memory", r, a,
                          {}, expandable)]
    return []


def _frag(dev: str, when: str, reserved: int, allocated: int, s: dict[str, Any],
          expandable: bool) -> Finding:
    gap = reserved - allocated
    ev = {"device": dev, "reserved": human_bytes(reserved), "allocated": human_bytes(allocated),
          "reserved_unused": f"{human_bytes(gap)} ({gap / reserved:.0%} of reserved)",
          "reserved_unused_bytes": gap}
    if s.get("alloc_retries"):
        ev["alloc_retries"] = s["alloc_retries"]
    if s.get("inactive_split"):
        ev["inactive_split_at_end"] = human_bytes(s["inactive_split"])
    title = (f"{human_bytes(gap)} of reserved CUDA memory ({gap / reserved:.0%}) was not usable "
             f"{when} on {dev}: fragmentation of the caching allocator")
    if expandable:
        fix = ("expandable_segments is already on: make tensor sizes regular (pad or bucket "
               "variable sequence lengths) and avoid keeping small tensors between large ones")
    else:
        fix = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place "
               "instead of new blocks of every size); pad or bucket variable shapes")
    return finding("memory-fragmentation", title, ev, fix=fix)


# ---- grad-in-eval ---------------------------------------------------------------------------

@rule("grad-in-eval", probes={"memory", "checkup"}, needs={"grad_eval"}, raises=[GRAD_IN_EVAL])
def grad_in_eval(ev: Evidence) -> list[Finding]:
    g = ev.last("grad_eval")
    if not g or not g.get("roots_hooked"):
        raise NotApplicable("no model forward was observed after the first training steps")
    never = int(g.get("dropped", 0)) + int(g.get("kept_alive", 0))
    if never < GRAD_EVAL_MIN:
        return []
    ex = g.get("examples") or []
    where = next((e["site"] for e in ex if e.get("site")), None)
    mod = ex[0]["module"] if ex else "the model"
    evid: dict[str, Any] = {
        "graph_building_forwards": g.get("graph_forwards"),
        "backpropagated": g.get("backpropagated"),
        "never_backpropagated": never,
        "where": [f"{e['count']}x {e['module']} in {e['mode']} mode called at {e['site']} "
                  f"(steps {e['first_step']}-{e['last_step']}), graph {e['outputs']}" for e in ex],
    }
    if g.get("unchecked"):
        evid["unchecked"] = (f"{g['unchecked']} forward(s) before the exact tracking began (it starts "
                             f"when a graph-building forward follows another with no backward "
                             f"between, at step {g.get('exact_from_step')})")
    in_eval = int(g.get("in_eval_mode") or 0)
    if _discarded_in_training(g, ex):
        # e.g. a GAN critic step `C(G(z).detach())`: a training model's graph built and dropped
        # at once. No memory is held past that line; the cost is the graph's bookkeeping and
        # the activations saved during that forward: worth knowing, not a warning
        title = (f"{never} forward passes of {mod} (train mode) built autograd graphs that were "
                 f"discarded unused" + (f", at {where}" if where else ""))
        fix = ("Where the output is only used detached (e.g. `G(z).detach()` in a critic step), "
               "compute it under `with torch.no_grad():`" + (f" at {where}" if where else "")
               + ": the forward then saves no activations for a backward that never comes")
        return [finding("grad-in-eval", title, evid, fix=fix, severity="info")]
    mode = f" ({in_eval} with the model in eval mode)" if in_eval else ""
    title = (f"{never} forward passes of {mod} built autograd graphs that were never "
             f"backpropagated{mode}" + (f", at {where}" if where else ""))
    fix = ("Run evaluation and inference under `with torch.no_grad():` (or "
           "`torch.inference_mode()`)" + (f" around {where}" if where else "")
           + ": no graph is built and activations are freed as soon as they are used")
    return [finding("grad-in-eval", title, evid, fix=fix)]


def _discarded_in_training(g: dict[str, Any], examples: list[dict[str, Any]]) -> bool:
    """Every never-backpropagated graph came from a model in train mode and was freed
    unused (none kept alive, none in eval mode): a detached use, not an evaluation loop."""
    return bool(examples) and not g.get("kept_alive") and not g.get("in_eval_mode") and all(
        e.get("mode") == "train" and e.get("outputs") == "dropped" for e in examples)


# ---- activation-dominated ------------------------------------------------------------------

@rule("activation-dominated", probes={"memory"}, needs={"mem_breakdown"},
      raises=[ACTIVATION_DOMINATED])
def activation_dominated(ev: Evidence) -> list[Finding]:
    b = ev.last("mem_breakdown")
    if not b:
        raise NotApplicable("no memory breakdown (the run ended before the backward of step 2)")
    parts = b.get("parts") or {}
    total = b.get("total")
    act = parts.get("activations")
    if act is None or not total:
        raise NotApplicable("activations or the allocated total were not measured")
    share = act / total
    if share < ACT_SHARE or act < ACT_MIN_BYTES:
        return []
    fixes = [f for f in rank_fixes({"activations": act},
                                   {"activations_fp32": b.get("activations_fp32", 0),
                                    "n_blocks": b.get("n_blocks", 0)})]
    ev_out = {"at": f"start of backward, step {b.get('step')} ({b.get('device')})",
              "activations": human_bytes(act), "total": human_bytes(total),
              "share": f"{share:.0%}",
              "breakdown": " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in parts.items()),
              "estimated_savings": {f["fix"]: human_bytes(f["saves"]) for f in fixes}}
    title = (f"activations are {share:.0%} of memory at the start of backward "
             f"({human_bytes(act)} of {human_bytes(total)})")
    return [finding("activation-dominated", title, ev_out, fix="; ".join(fix_lines(fixes, 3)))]
