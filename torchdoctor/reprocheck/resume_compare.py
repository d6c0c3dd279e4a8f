"""The resume check's comparison of a restart with the uninterrupted run, and its finding (pure).

Losses are compared exactly (the two runs are the same process up to the save: with nothing
reset they are bit-identical, so any difference after it is the reset's doing); before the save
they must agree exactly, else the script itself is not reproducible and the restart is not judged
(``repro`` without ``--resume-check`` says why). The LR of each step (``lr_trace``: one per live
optimizer) says when the schedule parted, before the losses show it, and whose (the first live
optimizer whose LR differs: the title names it when there are several). With an enabled
GradScaler the traced loss is the scaled one: it is divided by that step's scale (traced too)
before comparing.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.findings import Finding, finding
from torchdoctor.runner.frames import short_path
from torchdoctor.trials import loss_drift

LISTED = 6  # losses listed per run after the save


def _first_diff(a: list, b: list, start: int) -> int | None:
    """The first 1-based step > ``start`` where both runs have a value and they differ."""
    for i in range(start, min(len(a), len(b))):
        if a[i] != b[i]:
            return i + 1
    return None


def _lrs(run: Any) -> dict[int, list]:
    tr = run.evidence.last("lr_trace") or {}
    return dict(zip(tr.get("steps") or [], tr.get("lrs") or []))


def _scales(run: Any) -> dict[int, list]:
    tr = run.evidence.last("lr_trace") or {}
    return dict(zip(tr.get("steps") or [], tr.get("scales") or []))


def _losses(run: Any, unscale: bool) -> list:
    """Per-step losses; with ``unscale`` divided by the GradScaler's scale of that step (the traced
    loss is ``scaler.scale(loss)``: a reset scale alone must not read as a changed loss). Both runs
    are unscaled or neither (a baseline the caller ran without the resume trace has no scales)."""
    losses = run.losses()
    scales = _scales(run)
    if not unscale:
        return losses
    out = []
    for i, v in enumerate(losses):
        sc = scales.get(i + 1) or []
        out.append(float(v) / sc[0] if isinstance(v, (int, float)) and sc and sc[0] else v)
    return out


def compare(base: Any, run: Any, k: int, miss: Any) -> dict:
    out: dict[str, Any] = {"state": miss.state, "reset": miss.keys, "names": miss.names, "run": run.variation.name}
    why = run.failure()
    if why:
        return {**out, "verdict": "failed", "reason": why}
    unscale = bool(_scales(base)) and bool(_scales(run))
    bl, rl = _losses(base, unscale), _losses(run, unscale)
    before = _first_diff(bl[:k], rl[:k], 0)
    if before is not None or len(rl) < k:
        return {**out, "verdict": "not-reproducible",
                "reason": f"the runs differ before the save, at step {before}" if before else
                f"the restart run stopped at step {len(rl)}, before the save at step {k}"}
    reset = run.evidence.last("resume_reset")
    if not reset or not reset.get("reset"):
        failed = (reset or {}).get("failed") or []
        return {**out, "verdict": "not-applied",
                "reason": "the save was not reached again" if not reset else f"nothing could be reset: {failed}"}
    out["applied"] = reset.get("reset")
    if reset.get("failed"):
        out["not_reset"] = reset["failed"]
    stop = len(rl)
    step = _first_diff(bl[:stop], rl, k)
    b_lr, r_lr = _lrs(base), _lrs(run)
    lr_step = next((s for s in sorted(r_lr) if s > k and s in b_lr and b_lr[s] != r_lr[s]), None)
    drift, n = loss_drift(bl[k:stop], rl[k:stop])
    out.update(steps_compared=n, loss_drift=drift, first_divergent_step=step,
               losses={"uninterrupted": bl[k:k + LISTED], "resumed": rl[k:k + LISTED]})
    if lr_step is not None:
        bs, rs = b_lr[lr_step], r_lr[lr_step]
        out["lr"] = {"first_divergent_step": lr_step, "optimizer": _parted(bs, rs), "uninterrupted": bs, "resumed": rs}
    out["verdict"] = "differs" if step is not None else "same"
    return out


def _parted(b: Any, r: Any) -> int:
    """The index of the first live optimizer whose LR differs between two steps' LR lists (one LR
    per live optimizer, in the save event's ``live`` order); an optimizer only one run has counts."""
    b, r = list(b or []), list(r or [])
    n = max(len(b), len(r))
    b, r = b + [None] * (n - len(b)), r + [None] * (n - len(r))
    return next((i for i in range(n) if b[i] != r[i]), 0)


def _at(vs: Any, i: int) -> Any:
    return vs[i] if isinstance(vs, (list, tuple)) and i < len(vs) else None


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def finding_for(save: dict, miss: Any, cmp: dict, last_step: int) -> Finding:
    """The measured finding: the checkpoint family's code, fix and ``--expect resume`` severity."""
    from torchdoctor.catalog import lookup
    from torchdoctor.rules.checkpoint_saves import judge_save

    fam = [f for f in judge_save(save, last_step, 1, expect="resume") if f.code == miss.code]
    severity = fam[0].severity if fam else lookup(miss.code).severity
    fix = fam[0].fix if fam else ""
    where = short_path(str(save.get("where")))
    k, step = int(save.get("step") or 0), cmp["first_divergent_step"]
    b, r = cmp["losses"]["uninterrupted"], cmp["losses"]["resumed"]
    i = step - k - 1
    lr = cmp.get("lr")
    what = f"the {miss.state} state ({', '.join(miss.names)})" if miss.state != "rng" else \
        f"the RNG state ({', '.join(miss.names)})"
    title = (f"{save.get('fn', 'torch.save')} at {where}: resuming from this checkpoint (step {k}) is not exact: "
             f"without {what}")
    if lr:
        j = int(lr.get("optimizer") or 0)
        opts = (save.get("live") or {}).get("optimizers") or []
        whose = f" of optimizer {j} ({(opts[j] if j < len(opts) else {}).get('cls', '?')})" \
            if max(len(opts), len(lr["resumed"] or []), len(lr["uninterrupted"] or [])) > 1 else ""
        title += f" the LR{whose} at step {lr['first_divergent_step']} is {_num(_at(lr['resumed'], j))} " \
                 f"instead of {_num(_at(lr['uninterrupted'], j))};"
    title += f" losses differ from step {step}"
    if 0 <= i < len(b) and 0 <= i < len(r):
        title += f" ({_num(r[i])} resumed vs {_num(b[i])} uninterrupted)"
    evidence = {"saved_at": where, "restart_at_step": k, "reset_in_restart": cmp.get("applied"),
                "first_divergent_step": step, "losses_after_save": cmp["losses"],
                "measured": "the script run twice: uninterrupted, and restarted at this save with only this "
                            "state put back to a fresh process's value (docs/resume.md)"}
    if lr:
        evidence["lr_first_divergent_step"] = lr
    return finding(miss.code, title, evidence, fix=fix, severity=severity)
