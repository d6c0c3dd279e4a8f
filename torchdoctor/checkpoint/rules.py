"""Judgment: evidence of a read checkpoint → findings (pure functions, no I/O, no torch).

``judge`` runs every rule on an :class:`Evidence`; each rule returns findings and may
mark itself skipped with a reason ("not applicable" is not "healthy").

What is expected of a checkpoint depends on what it is for (``--expect``):
``resume`` requires everything needed to continue training exactly (optimizer,
scheduler when one drives the LR, RNG, progress counter, GradScaler under float16);
``weights`` requires only sound weights; ``auto`` (default) treats a checkpoint that
holds any optimizer/scheduler/scaler/RNG state as a training checkpoint and any other as
a weights export, which gets one info finding instead of a warning per missing part.
"""

from __future__ import annotations

from typing import Callable

from torchdoctor.checkpoint.rules_base import Evidence, Judgment, mode_of
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

__all__ = ["AUX_PICKLES", "Evidence", "Judgment", "RULES", "judge", "rule_unsafe_pickle"]

# order matters: the --model key comparison runs before the wrapper-prefix rule that reads its result
RULES: list[Callable[[Evidence, Judgment], None]] = [
    rule_unreadable_parts,
    rule_unsafe_pickle,
    rule_full_model_pickle,
    rule_missing_model,
    rule_missing_training_state,
    rule_nonfinite,
    rule_model_mismatch,
    rule_wrapper_prefix,
    rule_optimizer_mismatch,
    rule_device_tensors,
]


def judge(ev: Evidence) -> Judgment:
    j = Judgment()
    j.mode = mode_of(ev)
    for rule in RULES:
        rule(ev, j)
    return j
