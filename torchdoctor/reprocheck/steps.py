"""Two runs compared step by step, bitwise: the first divergent step and what diverged first.

Input: each run's ``fingerprint`` events (``instruments/repro/fingerprint.py``) and its per-step losses
(``TrialRun.losses()``). Within a step the order is the order of dependence: the data batch,
the initial parameters (step 1), the root modules' forward outputs, the loss, the gradients,
the parameters after the update. Values are compared exactly (float64 reductions of the same
tensors computed the same way: equal tensors give equal fingerprints; see docs/repro.md for why
no tolerance). Gradients are named closest-to-the-loss first (the order backward computes them).
"""

from __future__ import annotations

from typing import Any, Sequence

ORDER = ("batch", "init", "forward", "loss", "grad", "update")
WHAT = {"batch": "data batch", "init": "initial value", "forward": "forward output", "loss": "loss",
        "grad": "gradient", "update": "optimizer update"}
OF = {"init": "of parameter", "forward": "of module", "grad": "of parameter", "update": "of parameter"}
MAX_NAMES = 8


def by_step(events: Sequence[dict[str, Any]]) -> dict[int, dict[str, list]]:
    return {int(e["step"]): e.get("kinds") or {} for e in events if "step" in e}


def _diff_rows(ra: list, rb: list) -> tuple[list[str], bool]:
    """(labels whose values differ, structure differs)."""
    a = {r[0]: r[1:] for r in ra}
    b = {r[0]: r[1:] for r in rb}
    names = [r[0] for r in ra if r[0] in b and a[r[0]] != b[r[0]]]
    return names, set(a) != set(b)


def first_divergence(fa: dict[int, dict[str, list]], fb: dict[int, dict[str, list]],
                     la: Sequence, lb: Sequence) -> tuple[dict[str, Any] | None, int]:
    """(the first divergence or None, steps compared). A step counts as compared when both runs
    have its fingerprint or its loss."""
    steps = sorted((set(fa) & set(fb)) | {i + 1 for i in range(min(len(la), len(lb)))})
    for s in steps:
        ka, kb = fa.get(s, {}), fb.get(s, {})
        for kind in ORDER:
            if kind == "loss":
                va = la[s - 1] if s - 1 < len(la) else None
                vb = lb[s - 1] if s - 1 < len(lb) else None
                if va != vb:
                    return {"step": s, "what": "loss", "names": [], "count": 1}, steps.index(s) + 1
                continue
            ra, rb = ka.get(kind), kb.get(kind)
            if ra is None and rb is None:
                continue
            names, structure = _diff_rows(ra or [], rb or [])
            if not names and not structure:
                continue
            if kind == "grad":
                names = list(reversed(names))  # closest to the loss first: backward's order
            out = {"step": s, "what": kind, "names": names[:MAX_NAMES], "count": len(names)}
            if structure:
                only_a = sorted({r[0] for r in ra or []} - {r[0] for r in rb or []})
                only_b = sorted({r[0] for r in rb or []} - {r[0] for r in ra or []})
                out["structure"] = {"only_a": only_a[:MAX_NAMES], "only_b": only_b[:MAX_NAMES]}
            return out, steps.index(s) + 1
    return None, len(steps)


def describe(div: dict[str, Any]) -> str:
    """'gradient of parameter model.2.weight (and 3 more)', 'data batch: batch0[0]' — for
    people."""
    what = WHAT.get(div["what"], div["what"])
    names = div.get("names") or []
    if div["what"] == "loss" or not names:
        if div.get("structure"):
            return f"{what}: the runs saw different tensors"
        return what
    more = f" (and {div['count'] - 1} more)" if div.get("count", 1) > 1 else ""
    if div["what"] == "batch":
        return f"{what}: {names[0]}{more}"
    return f"{what} {OF.get(div['what'], 'of')} {names[0]}{more}"
