"""The script's own checkpoints, judged at the ``torch.save`` line that wrote them (probes checkup, repro).

Evidence: the ``save`` events of the save audit (``instruments/save_audit/save_audit.py``): what each save
held (the checkpoint family's roles) and the live models, optimizers, LR schedulers and
GradScalers at that moment. A checkpoint is what one step saved into one folder (one file, or
model, optimizer and scheduler in separate files: merged); one judgement per checkpoint's first
save line, on the last such checkpoint (a save into an in-memory buffer — a best-model snapshot —
is no checkpoint a preempted run could resume from). A save that alone is one part (only an
optimizer state, only RNG states) is not asked for the rest, as ``checkpoint-audit`` does not ask
a part file; a folder of a framework's multi-file layout (Trainer, accelerate, DeepSpeed, DCP,
recognised by its file names as ``checkpoint/layout.py`` does) is left to
``checkpoint-audit FOLDER``, which reads its JSON state files too.

The decision is the checkpoint family's (``rules/checkpoint_training.py``), applied to the save
as if it were the file (``rules/checkpoint_saves_roles.py``): a weights export is not asked for
training state, a training snapshot is, with the same severities. The live objects settle what
a file leaves open:

* optimizer: a snapshot without optimizer state is not flagged when no live optimizer holds any
  (plain SGD without momentum, and no scheduler driving it: nothing to lose); a snapshot that
  saves some optimizers but not every stateful live one is (a GAN saving only one of two);
* scheduler: with no optimizer state saved the file cannot tell whether a scheduler was used
  (info); a live one says it was (warning), no live one that it was not (nothing); a saved
  optimizer state without ``initial_lr`` says "no scheduler" to the file, but ReduceLROnPlateau
  never sets it: a live one not saved is a warning;
* scaler: an enabled live GradScaler is a float16 sign;
* a weights-only save is the family's single info (``ckpt-weights-export``) only when training
  went on after it and a live optimizer holds state: a periodic weights-only "checkpoint";
  a final export (no step after it) raises nothing.

A run without any save is judged healthy here (nothing saved, nothing missing), not skipped.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.rules import checkpoint_training as fam
from torchdoctor.rules.checkpoint_saves_roles import checkpoint_evidence, checkpoints, holds, live_names
from torchdoctor.runner.frames import short_path

PROBES = {"checkup", "repro"}
NEEDS = {"save", "save_sites", "step"}
FAMILY_EVIDENCE_DROPPED = ("optimizer_seen", "mode")  # file-audit wording; the save says it better
FAMILY_EVIDENCE_RENAMED = {"optimizer": "optimizer_key_in_save"}  # the path in the saved object


@rule("ckpt-saves", probes=PROBES, needs=NEEDS,
      raises=[fam.MISSING_OPTIMIZER, fam.MISSING_SCHEDULER, fam.MISSING_SCALER, fam.MISSING_RNG,
              fam.MISSING_PROGRESS])
def ckpt_saves(ev) -> list[Finding]:
    sites = ev.last("save_sites") or {}
    judged = checkpoints(ev.of("save"), sites.get("layouts") or [])
    if not judged:
        return []
    last_step = max((int(s.get("step") or 0) for s in ev.of("step")), default=0)
    counts = sites.get("sites") or {}
    kept = renamed_to(sites.get("renamed"))
    out: list[Finding] = []
    for save in judged:
        if save.get("layout"):
            continue  # a framework's multi-file folder (Trainer, accelerate, DeepSpeed, DCP): checkpoint-audit DIR
        out += judge_save(save, last_step, counts.get(save.get("where"), 1), kept=kept)
    return out


def renamed_to(pairs: Any) -> dict[str, str]:
    """Written name -> the name the script renamed it to (``tmp.pth.tar`` -> ``last.pth.tar``)."""
    out: dict[str, str] = {}
    for p in pairs or []:
        if isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p):
            out.setdefault(p[0], p[1])
    return out


def judge_save(save: dict, last_step: int, n_saves: int, expect: str = "auto",
               kept: dict[str, str] | None = None) -> list[Finding]:
    """The findings of one save (the resume check calls it with ``expect="resume"``)."""
    cev = checkpoint_evidence(save, expect)
    head = _head(save, n_saves, kept or {})
    if cev.mode == "weights":
        return _weights_only(save, cev, head, last_step)
    out = []
    for fn, refine in ((fam.missing_optimizer, _optimizer), (fam.missing_scheduler, _scheduler),
                       (fam.missing_scaler, None), (fam.missing_rng, None), (fam.missing_progress, None)):
        try:
            base = fn(cev)
        except NotApplicable:
            base = []
        got = refine(save, base, cev) if refine else [(f.severity, f.title, f.evidence, f.fix) for f in base]
        for sev, title, evid, fix in got:
            code = fn.__name__.replace("missing_", "ckpt-missing-")
            out.append(_finding(code, save, head, sev, title, evid, fix))
    return out


def _head(save: dict, n_saves: int, kept: dict[str, str]) -> dict:
    where = short_path(str(save.get("where")))
    name = save.get("name")
    out = {"saved_at": where, "call": save.get("fn", "torch.save"), "judged_save_at_step": save.get("step"),
           "saves_at_this_line": n_saves, "file": kept.get(name, name) if isinstance(name, str) else name,
           "holds": holds(save) or ["nothing recognised"]}
    if isinstance(name, str) and name in kept:  # written under a temporary name, then renamed: the kept name
        out["written_as"] = name
    if save.get("files"):  # several files saved at one step into one folder, judged as one checkpoint
        out["file"] = [kept.get(f, f) if isinstance(f, str) else f for f in save["files"]]
        out["save_lines"] = [short_path(w) for w in save.get("sites") or []]
    return out


def _finding(code: str, save: dict, head: dict, sev: str, title: str, evid: dict, fix: str) -> Finding:
    evidence = dict(head)
    evidence.update({FAMILY_EVIDENCE_RENAMED.get(k, k): v for k, v in evid.items() if k not in FAMILY_EVIDENCE_DROPPED})
    if save.get("truncated"):
        evidence["described"] = save["truncated"]
    return finding(code, f"{head['call']} at {head['saved_at']}: {title}", evidence, fix=fix, severity=sev)


def _stateful(save: dict) -> list[tuple[int, dict]]:
    opts = (save.get("live") or {}).get("optimizers") or []
    return [(i, o) for i, o in enumerate(opts) if o.get("stateful") or o.get("scheduled")]


def _optimizer(save: dict, base: list[Finding], cev: Any) -> list[tuple]:
    live = _stateful(save)
    matched = (save.get("matched") or {}).get("optimizers") or []
    if base:
        if not live:
            return []  # no live optimizer holds state or is scheduled: nothing lost
        f = base[0]
        names = ", ".join(o.get("cls", "?") for _i, o in live)
        return [(f.severity, f"a training snapshot without the state of the live optimizer ({names}): on resume "
                 "its momentum buffers / moments and step counts start again from zero",
                 {**f.evidence, "live_optimizers": [_opt_text(o) for _i, o in live]}, f.fix)]
    unsaved = [(i, o) for i, o in live if i < len(matched) and matched[i] is None]
    if not unsaved or cev.mode != "resume":
        return []
    info = fam.MISSING_OPTIMIZER
    return [(info.severity, f"{len(unsaved)} of {len(live)} live optimizers not saved "
             f"({', '.join(o.get('cls', '?') for _i, o in unsaved)}): on resume their state starts from zero",
             {"live_optimizers": [_opt_text(o) + (" (saved)" if matched[i] else " (not saved)")
                                  for i, o in live if i < len(matched)]},
             "Save every optimizer's state_dict() (one entry per optimizer) and restore each one.")]


def _opt_text(o: dict) -> str:
    lr = [x for x in o.get("lr") or [] if x is not None]
    return f"{o.get('cls', '?')} ({sum(o.get('groups') or [])} params" + (f", lr {lr[0]:g}" if lr else "") + \
        (", holds state" if o.get("stateful") else ", no state") + (", scheduled)" if o.get("scheduled") else ")")


def counter_driven(save: dict) -> list[str]:
    """Live schedulers outside torch's classes, each stepped (before the save) only with an explicit
    epoch/update counter: their LR is a function of that counter (``save_audit_counted.py``)."""
    out = []
    for s in (save.get("live") or {}).get("counter_schedulers") or []:
        calls, counted = int(s.get("calls") or 0), int(s.get("with_counter") or 0)
        if calls > 0 and counted == calls:
            out.append(f"{s.get('cls', '?')} ({calls} calls, each with the counter)")
    return out


def _scheduler(save: dict, base: list[Finding], cev: Any) -> list[tuple]:
    scheds = live_names(save, "schedulers")
    if base and not scheds and cev.roles.progress and counter_driven(save):
        # timm: lr_scheduler.step(epoch) / step_update(num_updates=n); on resume step(start_epoch) sets the
        # LR again from the saved epoch. The scheduler's state is a function of the saved counter.
        return []
    if not base:
        if cev.mode != "resume" or not scheds or cev.roles.schedulers or not cev.roles.optimizers:
            return []
        # the optimizer state is saved without initial_lr: ReduceLROnPlateau never sets it, so the
        # file cannot tell; the live scheduler can
        return [(fam.MISSING_SCHEDULER.severity,
                 f"an LR scheduler ({', '.join(scheds)}) drives this optimizer but its state was not saved: on "
                 "resume its counters (best value, patience, cooldown) restart", {"live_schedulers": scheds},
                 "Save scheduler.state_dict() and call scheduler.load_state_dict() after creating the scheduler "
                 "on resume.")]
    f = base[0]
    if "initial_lr_vs_lr" in f.evidence:  # initial_lr in the saved optimizer: the family knows a scheduler ran
        # The file hedges (info) when a counter is saved; the live run settles it: not counter-driven
        # (above), so the schedule restarts.
        title = ("an LR scheduler drove this optimizer (param_groups carry initial_lr) but its state was not "
                 "saved: on resume the schedule restarts from step 0")
        evid = {k: v for k, v in f.evidence.items() if k not in ("progress_saved", "mode")}
        return [(fam.MISSING_SCHEDULER.severity, title + (f" (live: {', '.join(scheds)})" if scheds else ""),
                 {**evid, **({"live_schedulers": scheds} if scheds else {})}, fam.SCHEDULER_FIX)]
    if not scheds:
        return []  # no optimizer state to tell, and no live scheduler: none was used
    return [(fam.MISSING_SCHEDULER.severity,
             f"an LR scheduler ({', '.join(scheds)}) drives training but neither its state nor the optimizer's "
             "was saved: on resume the schedule restarts from step 0", {"live_schedulers": scheds}, f.fix)]


def _weights_only(save: dict, cev: Any, head: dict, last_step: int) -> list[Finding]:
    step = int(save.get("step") or 0)
    live = _stateful(save)
    if not live or step >= last_step:
        return []  # an export after the last step, or nothing a resume would miss
    base = fam.weights_export(cev)
    if not base:
        return []
    f = base[0]
    names = ", ".join(o.get("cls", "?") for _i, o in live)
    return [_finding(f.code, save, head, f.severity,
                     f"saves weights only while {names} trains on (step {step} of {last_step} seen): fine as an "
                     "export, but training cannot resume exactly from this file",
                     {"live_optimizers": [_opt_text(o) for _i, o in live],
                      "mode": "weights export (no training state in the save)"}, f.fix)]
