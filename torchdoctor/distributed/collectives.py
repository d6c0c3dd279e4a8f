"""Pure analysis of the ranks' collective sequences and stacks (no I/O; used by the rules).

The recorder gives each rank's ``torch.distributed`` calls in order, each with the number of
optimizer steps completed when it was made. Comparing the ranks step by step names the
first place where they stopped calling the same thing:

* ``skip``: in that step one rank made a *subsequence* of another's calls: it left out the
  missing one(s) (the later calls then pair one off, until a rank waits for a partner that
  never comes: a hang);
* ``op``: same position, different collective or call site;
* ``shape`` / ``dtype``: same collective and site, different tensor shapes or dtypes.

``where`` reads a rank's faulthandler stack: the collective it is blocked in (the outermost
``torch.distributed`` frame) and the user's line that called it, or the user's line it is
at when it is not in a collective.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdoctor.runner.frames import is_user_file, short_path

_DIST_DIR = ("/torch/distributed/", "\\torch\\distributed\\")


def sequences(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each rank's calls on the default process group, in call order."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("kind") == "collective" and e.get("g") is None:
            out[int(e["rank"])].append(e)
    for r in out:
        out[r].sort(key=lambda e: int(e.get("seq", 0)))
    return dict(out)


# ops whose tensors must have the same shape and dtype on every rank
SHAPE_CHECKED = frozenset({"all_reduce", "broadcast", "reduce", "all_gather_into_tensor",
                           "_all_gather_base", "reduce_scatter_tensor", "_reduce_scatter_base",
                           "all_reduce_coalesced", "reduce_scatter"})


def _key(rec: dict[str, Any]) -> str:
    """What must match across ranks: the op (not the line: one collective may be called from
    two branches of an if on rank 0 and the others)."""
    return rec.get("op", "?")


def _is_subsequence(short: list, long: list) -> list[int] | None:
    """Indices of ``long`` missing from ``short`` if ``short`` is a subsequence of it."""
    missing: list[int] = []
    i = 0
    for j, item in enumerate(long):
        if i < len(short) and short[i] == item:
            i += 1
        else:
            missing.append(j)
    return missing if i == len(short) else None


def first_divergence(seqs: dict[int, list[dict[str, Any]]], complete_steps: dict[int, int] | None = None
                     ) -> dict[str, Any] | None:
    """The first step where the ranks' calls differ, and how (see the module docstring).

    ``complete_steps``: {rank: optimizer steps it completed}; the step a rank was still in
    when it stopped is compared only up to what that rank reached (a hung rank's last step
    is cut short; that is the hang's effect, not its cause).
    """
    ranks = sorted(seqs)
    if len(ranks) < 2:
        return None
    by_step: dict[int, dict[int, list[dict[str, Any]]]] = {r: defaultdict(list) for r in ranks}
    for r in ranks:
        for rec in seqs[r]:
            by_step[r][int(rec.get("step") or 0)].append(rec)
    steps = sorted({s for r in ranks for s in by_step[r]})
    for s in steps:
        lists = {r: by_step[r].get(s, []) for r in ranks}
        keys = {r: [_key(x) for x in lists[r]] for r in ranks}
        partial = {r for r in ranks if complete_steps is not None and complete_steps.get(r, 0) <= s}
        ref = max(ranks, key=lambda r: (len(keys[r]), -r))
        if all(keys[r] == keys[ref] for r in ranks):
            d = _shape_divergence(s, lists, ranks)
            if d:
                return d
            continue
        # a step that some rank did not finish: only a prefix of it can be compared
        if partial:
            n = min(len(keys[r]) for r in partial)
            if all(keys[r][:n] == keys[ref][:n] for r in ranks) and \
                    all(keys[r] == keys[ref] for r in ranks if r not in partial):
                d = _shape_divergence(s, {r: lists[r][:n] for r in ranks}, ranks)
                if d:
                    return d
                continue
        skipped: dict[int, list[int]] = {}
        for r in ranks:
            if keys[r] == keys[ref]:
                continue
            miss = _is_subsequence(keys[r], keys[ref])
            if miss is None:
                skipped = {}
                break
            skipped[r] = miss
        if skipped:
            first = min(m[0] for m in skipped.values())
            return {"kind": "skip", "step": s, "reference": ref,
                    "skipped_by": sorted(skipped),
                    "missing": lists[ref][first],
                    "missing_count": {r: len(m) for r, m in skipped.items()},
                    "next": {r: (lists[r][first] if first < len(lists[r]) else None)
                             for r in skipped}}
        i = next(i for i in range(max(len(k) for k in keys.values()))
                 if len({keys[r][i] if i < len(keys[r]) else None for r in ranks}) > 1)
        return {"kind": "op", "step": s, "index": i,
                "per_rank": {r: (lists[r][i] if i < len(lists[r]) else None) for r in ranks}}
    return None


def _shape_divergence(step: int, lists: dict[int, list[dict[str, Any]]], ranks: list[int]
                      ) -> dict[str, Any] | None:
    n = min(len(v) for v in lists.values())
    for i in range(n):
        shapes = {r: lists[r][i].get("shapes") for r in ranks}
        dtypes = {r: lists[r][i].get("dtype") for r in ranks}
        if lists[ranks[0]][i].get("op") not in SHAPE_CHECKED:
            continue  # objects, lists of per-rank tensors, uneven splits: sizes may differ
        if len({repr(v) for v in shapes.values()}) > 1:
            return {"kind": "shape", "step": step, "index": i,
                    "per_rank": {r: lists[r][i] for r in ranks}}
        if len(set(dtypes.values())) > 1:
            return {"kind": "dtype", "step": step, "index": i,
                    "per_rank": {r: lists[r][i] for r in ranks}}
    return None


def describe(rec: dict[str, Any] | None) -> str:
    """'all_reduce at train.py:31' (short path), or 'nothing' for None."""
    if rec is None:
        return "nothing"
    site = short_path(rec.get("site")) if rec.get("site") else None
    return f"{rec.get('op', '?')} at {site}" if site else str(rec.get("op", "?"))


def shape_text(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "-"
    shapes = rec.get("shapes") or []
    body = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
    return f"{body} {rec.get('dtype') or ''}".strip()


def where(stacks: dict[str, Any] | None) -> dict[str, Any]:
    """Where a rank's main thread was: {'collective': op | None, 'site': 'file:line', 'fn'}."""
    from torchdoctor.runner.stacks import main_thread

    if not stacks:
        return {}
    main = main_thread(stacks.get("threads") or [])
    if main is None:
        return {}
    frames = main["frames"]  # innermost first
    op = None
    for f in frames:
        path = f[0]
        # keep going outwards: the outermost torch.distributed function frame names the call
        # (not a module being imported: a rank still starting up waits in no collective)
        if any(p in path for p in _DIST_DIR) and f[2] not in ("wrapper", "<lambda>", "<module>"):
            op = f[2]
        if is_user_file(path):
            out = {"collective": op, "site": f"{path}:{f[1]}", "fn": f[2]}
            return out
    if op:
        return {"collective": op}
    return {"frames": [f"{f[0]}:{f[1]} in {f[2]}" for f in frames[:4]]}


def pending_fr(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flight-recorder entries not completed (NCCL marks them; gloo records only 'scheduled')."""
    return [e for e in entries if not e.get("completed") and e.get("state") in ("scheduled", "started")]
