"""Checkpoint rules on training state: what resuming exactly needs (``--expect``, docs/checkpoint.md).

Probe ``checkpoint-audit``; the evidence is :class:`torchdoctor.checkpoint.evidence.CheckpointEvidence`.
What the file is for (``ev.mode``: resume | weights | part) was decided once when the evidence was
built (``checkpoint/derive.py``): a weights export or one part of a multi-file checkpoint is not
asked for training state, and each rule here says so as its skip reason. A weights export under
``--expect auto`` gets one info finding instead (rule ``ckpt-weights-export``).
"""

from __future__ import annotations

from torchdoctor.catalog import declare
from torchdoctor.checkpoint.evidence import short
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import CHECKPOINTING

MAX_SIGNS_LISTED = 6  # float16 training signs listed by ckpt-missing-scaler

MISSING_OPTIMIZER = declare("ckpt-missing-optimizer", CHECKPOINTING, "warning",
                            "training cannot resume exactly: no optimizer state")
MISSING_SCHEDULER = declare("ckpt-missing-scheduler", CHECKPOINTING, "warning",
                            "no LR-scheduler state while the optimizer state suggests one is used (info when unknown)")
MISSING_RNG = declare("ckpt-missing-rng", CHECKPOINTING, "warning", "no RNG state (torch CPU/CUDA, numpy, python)")
MISSING_PROGRESS = declare("ckpt-missing-progress", CHECKPOINTING, "warning", "no epoch/step counter")
MISSING_SCALER = declare(
    "ckpt-missing-scaler", CHECKPOINTING, "warning",
    "float16 training signs but no GradScaler state: a few skipped steps on resume (info unless --expect resume)",
    thresholds={"MAX_SIGNS_LISTED": MAX_SIGNS_LISTED})

SCHEDULER_FIX = ("Save scheduler.state_dict() and call scheduler.load_state_dict() after creating the scheduler "
                 "on resume (create it before loading, with the same arguments).")

PROBES = {"checkpoint-audit"}
NEEDS = {"roles", "mode"}


def _resume_only(ev) -> None:
    """Training state is judged only for a training snapshot (mode resume)."""
    if ev.mode == "part":
        raise NotApplicable("one part of a multi-file checkpoint: audit the folder to judge the whole")
    if ev.mode == "weights":
        raise NotApplicable("--expect weights" if ev.expect == "weights"
                            else "judged a weights export (--expect resume to require)")


def _mode_text(ev) -> str:
    return "--expect resume" if ev.expect == "resume" else \
        "auto → resume (training state, progress counter or training config present)"


@rule("ckpt-weights-export", probes=PROBES, needs=NEEDS, raises=[MISSING_OPTIMIZER])
def weights_export(ev) -> list[Finding]:
    """One info finding for a weights export under ``--expect auto`` (not a warning per missing part)."""
    r = ev.roles
    if ev.mode != "weights" or ev.expect != "auto" or r.model is None or not r.model.tensors:
        return []
    return [finding(
        "ckpt-missing-optimizer",
        "weights-only checkpoint: fine for inference or fine-tuning, but training cannot resume exactly "
        "from it (no optimizer, scheduler, RNG state)",
        {"holds": sorted({v.split(" ")[0] for v in r.role_of.values()}),
         "mode": "auto → weights (pass --expect resume to require training state)"},
        fix="If this file is meant for resuming, save optimizer.state_dict(), scheduler.state_dict(), "
            "the RNG states and the epoch/step with the model.",
        severity="info",
    )]


@rule("ckpt-missing-optimizer", probes=PROBES, needs=NEEDS, raises=[MISSING_OPTIMIZER])
def missing_optimizer(ev) -> list[Finding]:
    _resume_only(ev)
    r = ev.roles
    if r.optimizers:
        return []
    held = r.training_state + (["config"] if r.config else [])
    what = ", ".join(list(r.progress)[:3] + r.config[:2]) or ", ".join(held) or "training state"
    return [finding(
        "ckpt-missing-optimizer",
        f"a training snapshot ({what}) without optimizer state: on resume the optimizer's state (momentum "
        "buffers, Adam moments, step counts) is lost and starts again from zero",
        {"training_state_present": held or "none", "mode": _mode_text(ev),
         "optimizer_seen": "no: the audit reads only the file, not the script that trains from it"},
        fix="Save optimizer.state_dict() with the model and restore it with optimizer.load_state_dict() after "
            "building the optimizer over the same parameters. Leaving it out is harmless only for a stateless "
            "optimizer (plain SGD without momentum), which checkpoint-audit cannot see from the file: if that is "
            "your optimizer, nothing is lost. If the file is meant only for inference, drop the counters or "
            "pass --expect weights.",
    )]


@rule("ckpt-missing-scheduler", probes=PROBES, needs=NEEDS, raises=[MISSING_SCHEDULER])
def missing_scheduler(ev) -> list[Finding]:
    _resume_only(ev)
    r = ev.roles
    if r.schedulers:
        return []
    if not r.optimizers:
        return [finding(
            "ckpt-missing-scheduler",
            "no LR-scheduler state, and no optimizer state to tell whether a scheduler was used",
            {"mode": _mode_text(ev)},
            fix="If an LR scheduler drives training, save scheduler.state_dict() too.",
            severity="info",
        )]
    opt = next((o for o in r.optimizers if o.has_initial_lr), None)
    if opt is None:  # no scheduler attached: metrics.checkpoint.facts.scheduler says so
        return []
    lrs = [(g.get("initial_lr"), g.get("lr")) for g in opt.param_groups if isinstance(g, dict)]
    evidence = {"optimizer": opt.path or "<root>", "initial_lr_vs_lr": [f"{a} → {b}" for a, b in lrs[:4]]}
    fix = SCHEDULER_FIX
    if r.progress and ev.expect != "resume":
        # A schedule set from the saved epoch/step (timm's lr_scheduler.step(start_epoch), a torch scheduler
        # rebuilt with last_epoch=) resumes from the counter; one with a counter of its own restarts. The
        # file cannot tell which (issue 27 item 5: a false warning on every timm checkpoint); the save
        # audit (checkup, repro) sees the live scheduler and decides.
        counters = ", ".join(f"{k} = {v}" for k, v in list(r.progress.items())[:3])
        return [finding(
            "ckpt-missing-scheduler",
            f"an LR scheduler drove this optimizer (param_groups carry initial_lr) and its state was not saved, "
            f"but the checkpoint holds {counters}: a schedule set from that counter (timm's "
            f"scheduler.step(epoch), or a scheduler rebuilt with last_epoch=) resumes; one that keeps a counter "
            f"of its own restarts from step 0. The file cannot tell which: checkup on the script judges it at "
            f"the save",
            {**evidence, "progress_saved": list(r.progress)[:3], "mode": _mode_text(ev)},
            fix=fix + " If the LR is set from the saved epoch/step on resume, nothing is lost.",
            severity="info",
        )]
    return [finding(
        "ckpt-missing-scheduler",
        "an LR scheduler drove this optimizer (param_groups carry initial_lr) but its state was not saved: "
        "on resume the schedule restarts from step 0",
        evidence, fix=fix,
    )]


@rule("ckpt-missing-rng", probes=PROBES, needs=NEEDS | {"rng_missing", "cuda_devices"}, raises=[MISSING_RNG])
def missing_rng(ev) -> list[Finding]:
    _resume_only(ev)
    r = ev.roles
    if not r.rng:
        # Most training code (nanoGPT, Lightning, torchvision's references) saves no RNG state and
        # resumes fine, only not bit-exactly: a warning when exact resumption is asked for, else info.
        return [finding(
            "ckpt-missing-rng",
            "no RNG state: after resuming, dropout masks, augmentation and shuffling differ from an "
            "uninterrupted run (the run continues fine, not bit-exactly)",
            {"looked_for": "torch CPU (uint8[5056]), CUDA (uint8[16] per device), numpy, python random states",
             "mode": _mode_text(ev)},
            fix="Save torch.get_rng_state(), torch.cuda.get_rng_state_all(), np.random.get_state() and "
                "random.getstate() (and the DataLoader generator's state) and restore them on resume.",
            severity=None if ev.expect == "resume" else "info",
        )]
    if "training state" in ev.derive_failed:
        raise NotApplicable(ev.derive_failed["training state"])
    missing = ev.rng_missing
    if not missing:
        return []
    return [finding(
        "ckpt-missing-rng",
        f"RNG state is incomplete: {' and '.join(missing)} generator state missing",
        {"found": [f"{k} at {v}" for k, v in r.rng.items()], "missing": missing,
         "cuda_tensors_on": ev.cuda_devices or "none"},
        fix="Add torch.get_rng_state() and, when training on GPU, torch.cuda.get_rng_state_all().",
    )]


@rule("ckpt-missing-progress", probes=PROBES, needs=NEEDS, raises=[MISSING_PROGRESS])
def missing_progress(ev) -> list[Finding]:
    _resume_only(ev)
    r = ev.roles
    if r.progress:
        return []
    alt = []
    for o in r.optimizers:
        for st in list(o.state.values())[:1]:
            if isinstance(st, dict) and "step" in st:
                alt.append(f"{o.path or 'optimizer'}.state[...].step (optimizer steps, not epochs)")
    if r.schedulers:
        alt.append(f"{r.schedulers[0]}.last_epoch (scheduler steps)")
    ev_ = {"looked_for": "epoch, step, global_step, iteration … at the top level or in a progress/state dict",
           "mode": _mode_text(ev)}
    if alt:
        ev_["partial_counters"] = alt
    return [finding(
        "ckpt-missing-progress",
        "no epoch/step counter: a resumed run does not know where to continue (epoch, sampler epoch, "
        "logging step)",
        ev_,
        fix="Save {'epoch': epoch, 'global_step': step} (the next epoch/step to run) and restore the loop "
            "and DistributedSampler.set_epoch from it.",
    )]


@rule("ckpt-missing-scaler", probes=PROBES, needs=NEEDS, raises=[MISSING_SCALER])
def missing_scaler(ev) -> list[Finding]:
    _resume_only(ev)
    r = ev.roles
    if r.scalers:
        return []
    if not r.fp16_signs:
        raise NotApplicable("no float16 training signs (config flags or float16 optimizer state)")
    ev_ = {"float16_signs": short(r.fp16_signs, MAX_SIGNS_LISTED)}
    if r.empty_scalers:
        ev_["empty_scaler_entries"] = r.empty_scalers
    # What a lost GradScaler state costs: the scale restarts at init_scale (65536); a run that had settled at
    # 2^k re-calibrates by halving on each overflowing step, and each such step is skipped (no optimizer
    # step, weights untouched): 16 - k skipped steps (measured: settled at 64 → 10 skipped on resume). Not
    # bit-exact, not harmful: info unless exact resumption is asked for (--expect resume), as for RNG state.
    framework = all(s.startswith("training_args.bin") for s in r.fp16_signs)
    if framework:
        ev_["note"] = "the Hugging Face Trainer saves no GradScaler state; it re-calibrates after a resume"
    ev_["cost_on_resume"] = ("the loss scale restarts at its initial value (65536 by default); if it had settled "
                             "at 2^k, the next 16-k steps overflow and are skipped while it re-calibrates")
    return [finding(
        "ckpt-missing-scaler",
        "float16 training signs but no GradScaler state: on resume the loss scale restarts at 65536 and "
        "re-calibrates, skipping a few optimizer steps (one per halving, weights untouched): not an exact resume",
        ev_,
        fix="Save scaler.state_dict() and restore it with scaler.load_state_dict() for an exact resume (an "
            "empty dict means the scaler was disabled: GradScaler(enabled=False)). Or train in bfloat16, which "
            "needs no scaler.",
        severity=None if ev.expect == "resume" and not framework else "info",
    )]
