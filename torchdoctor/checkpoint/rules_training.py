"""Rules on training state: what resuming exactly needs (see ``rules.py`` for ``--expect``)."""

from __future__ import annotations

from torchdoctor.checkpoint.rules_base import Evidence, Judgment, short
from torchdoctor.checkpoint.walk import iter_tensors
from torchdoctor.findings import finding


def rule_missing_training_state(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    codes = ("ckpt-missing-optimizer", "ckpt-missing-scheduler", "ckpt-missing-rng", "ckpt-missing-progress",
             "ckpt-missing-scaler")
    if j.mode == "part":
        for code in codes:
            j.skipped.append((code, "one part of a multi-file checkpoint: audit the folder to judge the whole"))
        return
    if j.mode == "weights":
        why = "--expect weights" if ev.expect == "weights" else "judged a weights export (--expect resume to require)"
        for code in codes:
            j.skipped.append((code, why))
        if ev.expect == "auto" and r.model is not None and r.model.tensors:
            j.findings.append(finding(
                "ckpt-missing-optimizer",
                "weights-only checkpoint: fine for inference or fine-tuning, but training cannot resume exactly "
                "from it (no optimizer, scheduler, RNG state)",
                {"holds": sorted({v.split(" ")[0] for v in r.role_of.values()}),
                 "mode": "auto → weights (pass --expect resume to require training state)"},
                fix="If this file is meant for resuming, save optimizer.state_dict(), scheduler.state_dict(), "
                    "the RNG states and the epoch/step with the model.",
                severity="info",
            ))
        return
    _missing_optimizer(ev, j)
    _missing_scheduler(ev, j)
    _missing_rng(ev, j)
    _missing_progress(ev, j)
    _missing_scaler(ev, j)


def _missing_optimizer(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.optimizers:
        return
    held = r.training_state + (["config"] if r.config else [])
    what = ", ".join(list(r.progress)[:3] + r.config[:2]) or ", ".join(held) or "training state"
    j.findings.append(finding(
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
    ))


def _missing_scheduler(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.schedulers:
        return
    if not r.optimizers:
        j.findings.append(finding(
            "ckpt-missing-scheduler",
            "no LR-scheduler state, and no optimizer state to tell whether a scheduler was used",
            {"mode": _mode_text(ev)},
            fix="If an LR scheduler drives training, save scheduler.state_dict() too.",
            severity="info",
        ))
        return
    opt = next((o for o in r.optimizers if o.has_initial_lr), None)
    if opt is None:
        j.facts["scheduler"] = "none attached (no initial_lr in param_groups)"
        return
    lrs = [(g.get("initial_lr"), g.get("lr")) for g in opt.param_groups if isinstance(g, dict)]
    j.findings.append(finding(
        "ckpt-missing-scheduler",
        "an LR scheduler drove this optimizer (param_groups carry initial_lr) but its state was not saved: "
        "on resume the schedule restarts from step 0",
        {"optimizer": opt.path or "<root>", "initial_lr_vs_lr": [f"{a} → {b}" for a, b in lrs[:4]]},
        fix="Save scheduler.state_dict() and call scheduler.load_state_dict() after creating the scheduler on "
            "resume (create it before loading, with the same arguments).",
    ))


def _cuda_devices(ev: Evidence) -> list[str]:
    root = ev.stub_root if ev.stub_root is not None else ev.contents.root
    return sorted({t.device for _n, t in iter_tensors(root) if t.device.startswith("cuda")})


def _missing_rng(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if not r.rng:
        # Most training code (nanoGPT, Lightning, torchvision's references) saves no RNG state and
        # resumes fine, only not bit-exactly: a warning when exact resumption is asked for, else info.
        j.findings.append(finding(
            "ckpt-missing-rng",
            "no RNG state: after resuming, dropout masks, augmentation and shuffling differ from an "
            "uninterrupted run (the run continues fine, not bit-exactly)",
            {"looked_for": "torch CPU (uint8[5056]), CUDA (uint8[16] per device), numpy, python random states",
             "mode": _mode_text(ev)},
            fix="Save torch.get_rng_state(), torch.cuda.get_rng_state_all(), np.random.get_state() and "
                "random.getstate() (and the DataLoader generator's state) and restore them on resume.",
            severity=None if ev.expect == "resume" else "info",
        ))
        return
    missing = []
    cuda = _cuda_devices(ev)
    if "torch" not in r.rng:
        missing.append("torch CPU")
    if cuda and "cuda" not in r.rng:
        missing.append("CUDA")
    j.facts["rng"] = {"found": r.rng, "missing": missing}
    if missing:
        j.findings.append(finding(
            "ckpt-missing-rng",
            f"RNG state is incomplete: {' and '.join(missing)} generator state missing",
            {"found": [f"{k} at {v}" for k, v in r.rng.items()], "missing": missing,
             "cuda_tensors_on": cuda or "none"},
            fix="Add torch.get_rng_state() and, when training on GPU, torch.cuda.get_rng_state_all().",
        ))


def _missing_progress(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.progress:
        return
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
    j.findings.append(finding(
        "ckpt-missing-progress",
        "no epoch/step counter: a resumed run does not know where to continue (epoch, sampler epoch, "
        "logging step)",
        ev_,
        fix="Save {'epoch': epoch, 'global_step': step} (the next epoch/step to run) and restore the loop "
            "and DistributedSampler.set_epoch from it.",
    ))


def _missing_scaler(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.scalers:
        return
    if not r.fp16_signs:
        j.skipped.append(("ckpt-missing-scaler", "no float16 training signs (config flags or float16 "
                                                 "optimizer state)"))
        return
    ev_ = {"float16_signs": short(r.fp16_signs, 6)}
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
    j.findings.append(finding(
        "ckpt-missing-scaler",
        "float16 training signs but no GradScaler state: on resume the loss scale restarts at 65536 and "
        "re-calibrates, skipping a few optimizer steps (one per halving, weights untouched): not an exact resume",
        ev_,
        fix="Save scaler.state_dict() and restore it with scaler.load_state_dict() for an exact resume (an "
            "empty dict means the scaler was disabled: GradScaler(enabled=False)). Or train in bfloat16, which "
            "needs no scaler.",
        severity=None if ev.expect == "resume" and not framework else "info",
    ))


def _mode_text(ev: Evidence) -> str:
    return "--expect resume" if ev.expect == "resume" else \
        "auto → resume (training state, progress counter or training config present)"
