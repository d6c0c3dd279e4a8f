"""Judgment: evidence of a read checkpoint → findings (pure functions, no I/O, no torch).

``judge`` runs every rule on an :class:`Evidence`; each rule returns findings and may
mark itself skipped with a reason ("not applicable" is not "healthy").

What is expected of a checkpoint depends on what it is for (``--expect``):
``resume`` requires everything needed to continue training exactly (optimizer,
scheduler when one drives the LR, RNG, progress counter, GradScaler under float16);
``weights`` requires only sound weights; ``auto`` (default) treats a checkpoint that
holds any optimizer/scheduler/scaler/RNG state, a progress counter or a training config as a
training snapshot and any other as a weights export, which gets one info finding instead of
a warning per missing part. A file that is one *part* of a multi-file checkpoint (only an
optimizer/scheduler/scaler/RNG state, or any file of an accelerate/Trainer/DeepSpeed/FSDP/DCP
folder) is judged as ``part`` under ``auto``: one info finding that names the folder to audit,
and no missing-model/-optimizer findings (``rules_parts.py``).

Every rule runs guarded (:func:`guarded`): one that raises on odd input becomes an
``internal-error`` finding and the other rules still run.
"""

from __future__ import annotations

from typing import Callable

from torchdoctor.checkpoint.rules_base import Evidence, Judgment, mode_of
from torchdoctor.checkpoint.rules_parts import part_of, rule_part_file
from torchdoctor.checkpoint.values import brief
from torchdoctor.checkpoint.rules_safety import AUX_PICKLES, rule_full_model_pickle, rule_unreadable_parts, \
    rule_unsafe_pickle
from torchdoctor.checkpoint.rules_tensors import (
    rule_device_tensors,
    rule_missing_model,
    rule_model_mismatch,
    rule_nonfinite,
    rule_optimizer_mismatch,
    rule_wrapper_prefix,
)
from torchdoctor.checkpoint.rules_training import rule_missing_training_state

__all__ = ["AUX_PICKLES", "Evidence", "Judgment", "RULES", "guarded", "judge", "rule_unsafe_pickle"]

# order matters: the --model key comparison runs before the wrapper-prefix rule that reads its result
RULES: list[Callable[[Evidence, Judgment], None]] = [
    rule_unreadable_parts,
    rule_unsafe_pickle,
    rule_full_model_pickle,
    rule_part_file,
    rule_missing_model,
    rule_missing_training_state,
    rule_nonfinite,
    rule_model_mismatch,
    rule_wrapper_prefix,
    rule_optimizer_mismatch,
    rule_device_tensors,
]


def judge(ev: Evidence) -> Judgment:
    """Run every rule; a rule that raises becomes an ``internal-error`` finding, the others still run."""
    j = Judgment()
    try:
        part = part_of(ev)
    except Exception:  # noqa: BLE001 - odd input: judged as a whole file, as before
        part = None
    if part:
        j.facts["part"] = part
    j.mode = "part" if part and ev.expect == "auto" else mode_of(ev)
    for rule in RULES:
        guarded(rule, ev, j)
    return j


def guarded(rule: Callable[[Evidence, Judgment], None], ev: Evidence, j: Judgment) -> None:
    n = len(j.findings)
    try:
        rule(ev, j)
    except Exception as e:  # noqa: BLE001 - a crafted checkpoint must not take the report down
        import traceback

        from torchdoctor.findings import internal_finding
        from torchdoctor.report.safe import visible

        del j.findings[n:]  # a half-built finding list of this rule is not evidence
        j.findings.append(internal_finding(
            f"checkpoint rule {rule.__name__} failed: {type(e).__name__}",
            {"rule": rule.__name__, "error": brief(str(e) if not isinstance(e, RecursionError) else "recursion", 300),
             "traceback": [visible(x)[:500] for x in traceback.format_exception(type(e), e, e.__traceback__,
                                                                                limit=-4)]},
        ))
