"""Two RNG traces compared: which global generators produced different values, and where.

Input: the ``rng_trace`` events of the two runs (``instruments/repro/rng_draws.py``). A generator is
**implicated** up to step S when, at some step boundary ≤ S, its state digests differ between
the two runs and it was drawn from by then:

* Python ``random`` and NumPy's legacy global generator: the draw counters (module-level draw
  functions), with the file:line of the first draws;
* torch CPU and CUDA default generators (draws are made inside torch, not counted): their state
  changed during a run (from start-up or between boundaries: a draw, or a seeding call) while
  differing between the runs;
* DataLoader workers: the base seeds of the multi-process iterators differ (in creation order);
* NumPy ``default_rng()`` without a seed: a fresh generator from OS entropy each run; implicated
  when one was made in both runs (its draws are not counted).

Not implicated generators are listed as ruled out, with why.
"""

from __future__ import annotations

from typing import Any

LABEL = {"python": "Python random (global)", "numpy": "NumPy global (legacy) generator",
         "torch": "torch CPU generator", "cuda": "torch CUDA generator",
         "dataloader-workers": "DataLoader worker seeding",
         "numpy-default-rng": "NumPy default_rng() without a seed"}


def _upto(steps: list[int], vals: list, s: int) -> list:
    return [v for st, v in zip(steps, vals) if st <= s]


def draw_counts(r: dict[str, Any] | None) -> dict[str, Any]:
    if not r:
        return {}
    return {g: int(n) for g, n in (r.get("draws") or {}).items() if g in ("python", "numpy")}


def compare_generators(ra: dict[str, Any] | None, rb: dict[str, Any] | None,
                       upto: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(implicated, ruled_out): dicts {generator, label, ...}."""
    if not ra or not rb:
        return [], [{"generator": "all", "label": "generators", "why": "no RNG trace"}]
    implicated: list[dict[str, Any]] = []
    ruled: list[dict[str, Any]] = []
    sa, sb = ra.get("steps") or [], rb.get("steps") or []
    last = min(upto, sa[-1] if sa else 0, sb[-1] if sb else 0) if sa and sb else upto
    for g in ("python", "numpy", "torch", "cuda"):
        xa = _upto(sa, (ra.get("states") or {}).get(g) or [], last)
        xb = _upto(sb, (rb.get("states") or {}).get(g) or [], last)
        pairs = [(i, a, b) for i, (a, b) in enumerate(zip(xa, xb)) if a is not None and b is not None]
        if not pairs:
            ruled.append({"generator": g, "label": LABEL[g], "why": "not in use"})
            continue
        differ = [sa[i] for i, a, b in pairs if a != b]
        if g in ("python", "numpy"):
            da = _upto(sa, (ra.get("draws_by_step") or {}).get(g) or [], last)
            db = _upto(sb, (rb.get("draws_by_step") or {}).get(g) or [], last)
            drawn = max(da[-1] if da else 0, db[-1] if db else 0)
            moved = drawn > 0
        else:
            drawn = None
            st_a = {(ra.get("start") or {}).get(g)} | {a for _i, a, _b in pairs}
            st_b = {(rb.get("start") or {}).get(g)} | {b for _i, _a, b in pairs}
            moved = len(st_a - {None}) > 1 or len(st_b - {None}) > 1
        if differ and moved:
            row: dict[str, Any] = {"generator": g, "label": LABEL[g], "first_step": differ[0]}
            if drawn is not None:
                row["draws"] = drawn
                row["sites"] = ((ra.get("sites") or {}).get(g) or [])[:4]
            implicated.append(row)
        elif differ:
            ruled.append({"generator": g, "label": LABEL[g],
                          "why": "its state differed but nothing drew from it"})
        else:
            ruled.append({"generator": g, "label": LABEL[g], "why": "same state in both runs"})
    la, lb = ra.get("loaders") or [], rb.get("loaders") or []
    seeds = [(x.get("base_seed"), y.get("base_seed"), x.get("where")) for x, y in zip(la, lb)]
    bad = [s for s in seeds if s[0] is not None and s[0] != s[1]]
    if bad:
        implicated.append({"generator": "dataloader-workers", "label": LABEL["dataloader-workers"],
                           "sites": [{"where": w, "fn": "DataLoader(num_workers>0)"} for _a, _b, w in bad[:4]]})
    elif seeds:
        ruled.append({"generator": "dataloader-workers", "label": LABEL["dataloader-workers"],
                      "why": "same worker base seeds in both runs"})
    fa, fb = ra.get("unseeded_generators") or [], rb.get("unseeded_generators") or []
    if fa and fb:
        implicated.append({"generator": "numpy-default-rng", "label": LABEL["numpy-default-rng"],
                           "sites": [{"where": x["where"], "fn": "numpy.random.default_rng()",
                                      "count": x.get("count")} for x in fa[:4]]})
    return implicated, ruled
