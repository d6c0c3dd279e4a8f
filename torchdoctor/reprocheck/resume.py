"""``repro --resume-check``: does resuming from the script's own checkpoint give the same training?

One entry, :func:`resume_check` (called by ``commands/repro.py``), on the trials layer:

1. **baseline**: the script as it is, every ``torch.save`` described, the loss, the LR (and a
   GradScaler's scale) of every step traced — or the caller's run when it was made with
   ``baseline_variation()``'s options and needs (``resume_trace``; ``save``, ``lr_trace``), which
   saves one run;
2. **the checkpoint**: the first training snapshot saved with steps after it (``saved.py``), and
   the states it lacks that something live needs (optimizer, scheduler, scaler, RNG);
3. **one restart per missing state**: the same script again; at that save, right after it was
   written, the child puts that one state back to a fresh process's value and keeps the rest as
   saved (``instruments/save_audit/save_audit_reset.py``), and the run goes on to ``AFTER_STEPS`` steps past
   the save;
4. **comparison** (``resume_compare.py``): the runs must agree exactly up to the save (else the
   script is not reproducible and nothing is judged); after it, the first step whose loss
   differs, and the first whose LR differs, name what the state's absence changes.

The restarts write the script's own checkpoints again, from a state torchdoctor altered: the
files the baseline (the script as it is) wrote next to them are kept aside before and put back
after (``guard.py``), so the user's files end as a plain run leaves them.

A state whose absence changed the losses is a finding of its checkpoint code, at the save's
line, with the severity the checkpoint family gives under ``--expect resume`` (the user asked
for an exact resume); one whose absence changed nothing within the replayed steps is reported
in the section only. The section (``json_section``) lists every run and comparison.
Cost: the baseline (unless given) plus one run to ``save step + AFTER_STEPS`` per missing state.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.findings import Finding
from torchdoctor.reprocheck.guard import OwnFiles
from torchdoctor.reprocheck.resume_compare import compare, finding_for
from torchdoctor.reprocheck.saved import choose, missing_states, not_simulated
from torchdoctor.trials import Variation

AFTER_STEPS = 6  # steps replayed after the save
RESUME_NEEDS = frozenset({"save", "lr_trace"})


def baseline_variation() -> Variation:
    return Variation("resume-baseline", "the script as it is; saves described, LR traced",
                     options={"resume_trace": True}, needs=RESUME_NEEDS)


def restart_variation(save: dict, miss: Any) -> Variation:
    where, n = save.get("reset_at") or [save.get("where"), save.get("n")]
    return Variation(f"resume-without-{miss.state}", f"restart at {where} (save {n}) without the {miss.state} state",
                     options={"resume_trace": True, "resume_reset": {"site": where, "n": n, "reset": miss.keys}},
                     needs=RESUME_NEEDS)


def resume_check(trials: Any, *, baseline: Any = None, after_steps: int = AFTER_STEPS
                 ) -> tuple[list[Finding], dict]:
    """(findings, the ``resume`` section of the report) for the script of ``trials``."""
    usable = baseline is not None and baseline.evidence.of("save") and baseline.evidence.of("lr_trace")
    base = baseline if usable else trials.run(baseline_variation())
    section: dict[str, Any] = {"baseline": base.variation.name}
    why = base.failure()
    if why:
        return [], {**section, "status": "not-judged", "reason": f"the baseline run failed: {why}"}
    ev = base.evidence
    last = max((int(s.get("step") or 0) for s in ev.of("step")), default=0)
    save = choose(ev.of("save"), last, (ev.last("save_sites") or {}).get("layouts"))
    if save is None:
        return [], {**section, "status": "no-checkpoint", "reason": no_checkpoint_reason(ev, last)}
    k = int(save["step"])
    section["checkpoint"] = {"saved_at": save.get("where"), "save": save.get("n"), "step": k,
                             "file": save.get("name")}
    missing = missing_states(save)
    section["not_simulated"] = not_simulated(save)
    if not missing:
        return [], {**section, "status": "complete", "restarts": []}
    stop = min(last, k + after_steps) if last else k + after_steps
    findings, restarts, section["own_files"], refused = run_restarts(
        trials, base, save, missing, stop, lambda run, miss: compare(base, run, k, miss),
        lambda miss, cmp: finding_for(save, miss, cmp, last))
    if refused:
        return [], {**section, "status": "not-run", "reason": refused}
    diverged = any(r["verdict"] == "differs" for r in restarts)
    nondet = any(r["verdict"] == "not-reproducible" for r in restarts)
    section.update(status="not-reproducible" if nondet and not diverged else
                   "inexact" if diverged else "exact", restarts=restarts)
    return findings, section


def run_restarts(trials: Any, base: Any, save: dict, missing: list, stop: int, compare_one: Any,
                 finding_one: Any) -> tuple[list, list, dict, str | None]:
    """One restart per missing state, each stopped at ``stop`` (one process or N ranks: the
    comparison and the finding are the caller's). The restarts write the script's checkpoints
    again: they are kept aside first and put back after (``OwnFiles``). Returns (findings,
    restarts, own_files summary, why none ran: the files could not be kept aside, or None)."""
    own = OwnFiles(base)
    if not own.keep():
        return [], [], own.summary(), own.refused
    restarts, findings = [], []
    try:
        for miss in missing:
            if trials.expired():
                restarts.append({"state": miss.state, "verdict": "not-run", "reason": "out of time budget"})
                continue
            run = trials.run(restart_variation(save, miss), steps=stop)
            cmp = compare_one(run, miss)
            restarts.append(cmp)
            if cmp["verdict"] == "differs":
                findings.append(finding_one(miss, cmp))
    finally:
        own.restore()
    return findings, restarts, own.summary(), None


def no_checkpoint_reason(ev: Any, last: int) -> str:
    """Why the baseline gave no checkpoint to restart from."""
    # saves counted but none described: each went into an in-memory buffer (issue 27 re-run:
    # Lightning's checkpoint writer torch.saves into io.BytesIO and writes the bytes itself)
    in_memory = sum((ev.last("save_sites") or {}).get("sites", {}).values())
    if ev.of("save"):
        return f"no save to a file or DCP folder with at least 2 training steps after it (of {last} steps run)"
    if in_memory:
        return (f"the script's {in_memory} torch.save call(s) wrote into in-memory buffers (io.BytesIO: "
                "a best-model copy, or a framework that writes the buffer's bytes to the file itself, "
                "as Lightning's checkpoint writer does), not judged at the save: checkpoint-audit FILE "
                "judges the file it wrote")
    return "the script saved no checkpoint to a file or DCP folder"


def supersede(findings: list[Finding], measured: list[Finding]) -> list[Finding]:
    """The report's findings with the save audit's judgement of a code at a save line replaced by
    the resume check's measured one (same code, same ``saved_at``)."""
    key = {(f.code, f.evidence.get("saved_at")) for f in measured}
    return [f for f in findings if (f.code, f.evidence.get("saved_at")) not in key] + list(measured)
