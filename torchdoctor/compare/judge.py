"""Two reports → one comparison (pure: dicts in, a dict out; no I/O, no torch).

Each measured quantity becomes a *delta* ``{metric, label, unit, before, after, delta, rel,
band, verdict, direction, basis}``. The **noise band** comes from the per-step series the
reports carry, never from a constant alone:

* a **median** (step time, data wait; ``metrics.steps.series``, warm-up steps left out):
  its standard error is ``1.2533 · σ / √n`` with σ estimated robustly as ``1.4826 · MAD``; the
  band is ``Z`` = 2 standard errors of the difference, ``Z · √(se_before² + se_after²)``;
* a **peak** of a memory timeline (``metrics.memory.timeline``: host RSS and heap, each CUDA
  device's peak allocated): the step-to-step jitter of both timelines
  (``1.4826 · MAD(successive differences) / √2``) combined the same way;
* **MFU / achieved FLOP/s** is FLOPs / step time: its band is the step time's relative band;
* every band is at least ``MIN_REL`` of the before value (``trials.compare.MIN_NOISE``, the floor
  ``treat`` uses) and, for memory, ``MEM_MIN_BYTES``.

A delta inside its band is ``within noise``; outside it, ``faster``/``slower`` (time),
``smaller``/``larger`` (memory), ``higher``/``lower`` (MFU), and ``direction`` says ``better``
or ``worse``. A side without the series gives ``not judged`` with the reason: a delta with no
band is shown, never judged. The phase means other than data wait have no per-step series in a
report, so they are shown and not judged.

Findings are matched by code: ``appeared`` (in AFTER only), ``resolved`` (BEFORE only),
``changed`` (severity moved). Growing memory sites (memory-growth's ``growing_sites`` and
``graph_growth``) are matched by their ``FILE:LINE``.

A **regression** is a delta whose direction is ``worse``, a warning/error finding that appeared
(or whose severity rose to one), or a growing site that appeared; ``cpu-oversubscribed`` raised by
*other* processes (evidence ``other_processes_cores``) is the host's load, not the change, and is
listed but never counted.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any, Sequence

from torchdoctor.trials.compare import MIN_NOISE

SCHEMA = 1  # the comparison's own JSON shape (docs/compare.md)
Z = 2.0  # standard errors of the difference: about a 95 % band
MIN_REL = MIN_NOISE
MEM_MIN_BYTES = 2 ** 20
MIN_POINTS = 3  # fewer points than this: no band from a series
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
WORDS = {"time": ("faster", "slower"), "memory": ("smaller", "larger"), "rate": ("higher", "lower")}
SITE_RE = re.compile(r"^(.+?:\d+)")


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _clean(values: Sequence[Any]) -> list[float]:
    return [v for v in (_num(x) for x in values or []) if v is not None]


def median_se(values: Sequence[float]) -> float | None:
    """Standard error of the median of ``values`` (robust σ from the MAD); None below MIN_POINTS."""
    if len(values) < MIN_POINTS:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(values))


def jitter(values: Sequence[float]) -> float | None:
    """Step-to-step noise of a timeline: robust σ of its successive differences / √2."""
    if len(values) < MIN_POINTS:
        return None
    diffs = [b - a for a, b in zip(values, values[1:])]
    med = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - med) for d in diffs) / math.sqrt(2)


def steady_series(rep: dict, key: str) -> list[float] | None:
    """``metrics.steps.series[key]`` without the warm-up steps; None when the report has none."""
    steps = (rep.get("metrics") or {}).get("steps") or {}
    series = steps.get("series") or {}
    vals, nums = series.get(key), series.get("step")
    if not isinstance(vals, list) or not isinstance(nums, list) or len(vals) != len(nums):
        return None
    warm = _num(steps.get("warmup_skipped")) or 0
    return _clean(v for v, s in zip(vals, nums) if (_num(s) or 0) > warm)


def delta(metric: str, label: str, unit: str, kind: str, before: float | None, after: float | None,
          band: float | None, basis: str, lower_is_better: bool = True, why_no_band: str = "",
          floor: float = 0.0) -> dict[str, Any] | None:
    """One compared quantity (None when neither report has it)."""
    if before is None and after is None:
        return None
    out: dict[str, Any] = {"metric": metric, "label": label, "unit": unit, "before": before,
                           "after": after, "delta": None, "rel": None, "band": None,
                           "verdict": "not judged", "direction": None, "basis": basis}
    if before is None or after is None:
        out["reason"] = f"only the {'after' if before is None else 'before'} report has it"
        return out
    d = after - before
    out["delta"] = d
    out["rel"] = d / before if before else None
    if band is None:
        out["reason"] = why_no_band or "no per-step series to take a noise band from"
        return out
    band = max(band, MIN_REL * abs(before), floor)
    out["band"] = band
    if abs(d) <= band:
        out["verdict"] = "within noise"
        return out
    better_word, worse_word = WORDS[kind]
    if kind == "rate":  # higher is better
        better = d > 0
        out["verdict"] = better_word if d > 0 else worse_word
    else:
        better = (d < 0) == lower_is_better
        out["verdict"] = better_word if d < 0 else worse_word
    out["direction"] = "better" if better else "worse"
    return out


def _combined(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else Z * math.sqrt(a * a + b * b)


def step_deltas(b: dict, a: dict) -> list[dict]:
    out = []
    sb, sa = (r["metrics"].get("steps") or {} for r in (b, a))
    wb, wa = steady_series(b, "wall_ms"), steady_series(a, "wall_ms")
    band = _combined(median_se(wb) if wb else None, median_se(wa) if wa else None)
    out.append(delta("steps.median_step_ms", "step time (median)", "ms", "time",
                     _num(sb.get("median_step_ms")), _num(sa.get("median_step_ms")), band,
                     "median of the judged steps; band from metrics.steps.series.wall_ms"))
    db, da = steady_series(b, "data_ms"), steady_series(a, "data_ms")
    out.append(delta("steps.data_wait_ms", "data wait (median per step)", "ms", "time",
                     statistics.median(db) if db else None, statistics.median(da) if da else None,
                     _combined(median_se(db) if db else None, median_se(da) if da else None),
                     "median of metrics.steps.series.data_ms after warm-up"))
    for phase in ("forward", "backward", "optimizer", "other"):
        out.append(delta(f"steps.mean_ms.{phase}", f"{phase} (mean per step)", "ms", "time",
                         _num((sb.get("mean_ms") or {}).get(phase)), _num((sa.get("mean_ms") or {}).get(phase)),
                         None, "metrics.steps.mean_ms",
                         why_no_band="the reports keep no per-step series of this phase: shown, not judged"))
    return [d for d in out if d is not None]


def _peaks(rep: dict) -> dict[str, tuple[str, list[float]]]:
    tl = ((rep.get("metrics") or {}).get("memory") or {}).get("timeline") or {}
    out: dict[str, tuple[str, list[float]]] = {}
    for key, label in (("rss", "host RSS peak"), ("heap", "host heap peak")):
        vals = _clean(tl.get(key) or []) if isinstance(tl.get(key), list) else []
        if vals:
            out[key] = (label, vals)
    for key, dev in sorted(tl.items()):
        if key.startswith("cuda:") and isinstance(dev, dict) and isinstance(dev.get("peak_allocated"), list):
            vals = _clean(dev["peak_allocated"])
            if vals:
                out[key] = (f"{key} peak allocated", vals)
    return out


def memory_deltas(b: dict, a: dict) -> list[dict]:
    pb, pa = _peaks(b), _peaks(a)
    out = []
    for key in sorted(set(pb) | set(pa)):
        label = (pb.get(key) or pa.get(key))[0]
        vb, va = (pb.get(key) or (None, None))[1], (pa.get(key) or (None, None))[1]
        band = _combined(jitter(vb) if vb else None, jitter(va) if va else None)
        d = delta(f"memory.peak.{key}", label, "bytes", "memory", max(vb) if vb else None,
                  max(va) if va else None, band, "max of metrics.memory.timeline; band from its "
                  "step-to-step jitter", floor=MEM_MIN_BYTES)
        if d is not None:
            out.append(d)
    return out


def flops_deltas(b: dict, a: dict, step: dict | None) -> list[dict]:
    fb, fa = ((r["metrics"].get("flops") or {}) for r in (b, a))
    rel = step["band"] / step["before"] if step and step.get("band") and step.get("before") else None
    out = []
    for key, label, unit in (("mfu", "MFU", "ratio"), ("achieved_flops_per_s", "achieved FLOP/s", "FLOP/s")):
        vb, va = _num(fb.get(key)), _num(fa.get(key))
        d = delta(f"flops.{key}", label, unit, "rate", vb, va, rel * vb if rel is not None and vb else None,
                  "FLOPs / step time: the step time's relative band",
                  why_no_band="no noise band of the step time to scale")
        if d is not None:
            out.append(d)
    return out


def _host_load(f: dict) -> bool:
    return f.get("code") == "cpu-oversubscribed" and "other_processes_cores" in (f.get("evidence") or {})


def _by_code(rep: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in rep.get("findings") or []:
        if not isinstance(f, dict) or not isinstance(f.get("code"), str):
            continue
        have = out.get(f["code"])
        if have is None or SEVERITY_RANK.get(f.get("severity"), 0) > SEVERITY_RANK.get(have.get("severity"), 0):
            out[f["code"]] = f
    return out


def _brief(f: dict) -> dict[str, Any]:
    out = {"code": f.get("code"), "severity": f.get("severity"), "title": str(f.get("title", ""))[:300]}
    if _host_load(f):
        out["host_load"] = True
    return out


def finding_changes(b: dict, a: dict) -> dict[str, list]:
    cb, ca = _by_code(b), _by_code(a)
    changed = [{"code": c, "before": cb[c].get("severity"), "after": ca[c].get("severity"),
                "title": str(ca[c].get("title", ""))[:300]}
               for c in sorted(set(cb) & set(ca)) if cb[c].get("severity") != ca[c].get("severity")]
    return {"appeared": [_brief(ca[c]) for c in sorted(set(ca) - set(cb))],
            "resolved": [_brief(cb[c]) for c in sorted(set(cb) - set(ca))],
            "changed": changed, "kept": sorted(set(cb) & set(ca))}


def _sites(rep: dict) -> dict[str, str]:
    out = {}
    for f in rep.get("findings") or []:
        if isinstance(f, dict) and f.get("code") == "memory-growth":
            ev = f.get("evidence") or {}
            for key in ("growing_sites", "graph_growth"):
                for s in ev.get(key) or []:
                    m = SITE_RE.match(str(s))
                    if m:
                        out.setdefault(m.group(1), str(s)[:300])
    return out


def site_changes(b: dict, a: dict) -> dict[str, list]:
    sb, sa = _sites(b), _sites(a)
    return {"appeared": [sa[k] for k in sorted(set(sa) - set(sb))],
            "resolved": [sb[k] for k in sorted(set(sb) - set(sa))]}


def _side(rep: dict, path: str) -> dict[str, Any]:
    steps = (rep.get("metrics") or {}).get("steps") or {}
    return {"path": path, "command": rep.get("command"), "target": rep.get("target"),
            "status": rep.get("status"), "steps_judged": steps.get("judged"),
            "device": (rep.get("context") or {}).get("device")}


def compare(before: dict, after: dict, before_path: str = "", after_path: str = "") -> dict[str, Any]:
    """The comparison of two reports (docs/compare.md)."""
    deltas = step_deltas(before, after)
    step = next((d for d in deltas if d["metric"] == "steps.median_step_ms"), None)
    deltas += memory_deltas(before, after) + flops_deltas(before, after, step)
    findings = finding_changes(before, after)
    sites = site_changes(before, after)
    regressions = [f"{d['label']}: {d['verdict']}" for d in deltas if d["direction"] == "worse"]
    regressions += [f"{f['code']} ({f['severity']}) appeared" for f in findings["appeared"]
                    if f.get("severity") in ("warning", "error") and not f.get("host_load")]
    regressions += [f"{c['code']}: {c['before']} → {c['after']}" for c in findings["changed"]
                    if SEVERITY_RANK.get(c["after"], 0) > SEVERITY_RANK.get(c["before"], 0)
                    and c["after"] in ("warning", "error")]
    regressions += [f"growing memory site appeared: {s}" for s in sites["appeared"]]
    improvements = [f"{d['label']}: {d['verdict']}" for d in deltas if d["direction"] == "better"]
    improvements += [f"{f['code']} ({f['severity']}) resolved" for f in findings["resolved"]
                     if f.get("severity") in ("warning", "error") and not f.get("host_load")]
    improvements += [f"growing memory site resolved: {s}" for s in sites["resolved"]]
    notes = []
    sides = (_side(before, before_path), _side(after, after_path))
    if sides[0]["device"] != sides[1]["device"]:
        notes.append(f"different devices: {sides[0]['device']} vs {sides[1]['device']}")
    if sides[0]["target"] != sides[1]["target"]:
        notes.append("different targets: the comparison assumes the same training, changed")
    verdict = ("regression" if regressions else "improvement" if improvements else "within noise")
    from torchdoctor.version import __version__

    return {"tool": "torchdoctor", "version": __version__, "command": "compare",
            "compare_schema": SCHEMA, "verdict": verdict,
            "before": sides[0], "after": sides[1], "deltas": deltas, "findings": findings,
            "growing_sites": sites, "regressions": regressions, "improvements": improvements,
            "notes": notes}
