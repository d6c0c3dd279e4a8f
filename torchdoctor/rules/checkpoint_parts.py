"""Checkpoint rule ``ckpt-part-file``: the audited file is one part of a multi-file checkpoint.

Probe ``checkpoint-audit``. Whether the file is a part (an optimizer, scheduler, scaler or RNG state
alone, or any file of an accelerate/Trainer/DeepSpeed/FSDP/DCP folder) was decided once when the
evidence was built (``checkpoint/parts.py``); this rule says what the part is and which folder to
audit. Paths in titles stay exact (the JSON keeps them); the console shows them through ``visible()``.
"""

from __future__ import annotations

from torchdoctor.catalog import declare
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import rule
from torchdoctor.skills import CHECKPOINTING

MAX_ROLES_LISTED = 8  # recognised entries listed in the finding's evidence

PART_FILE = declare(
    "ckpt-part-file", CHECKPOINTING, "info",
    "the file is one part of a checkpoint (only optimizer, scheduler, scaler or RNG state, or one file of "
    "an accelerate/Trainer/DeepSpeed/DCP folder): audit the folder",
    thresholds={"MAX_ROLES_LISTED": MAX_ROLES_LISTED})


@rule("ckpt-part-file", probes={"checkpoint-audit"}, needs={"roles", "part"}, raises=[PART_FILE])
def part_file(ev) -> list[Finding]:
    part = ev.part
    if not part:
        return []
    article = "an" if (part["layout"] or "")[:1].lower() in "aeiou" else "a"
    if part["layout"] and part["folder_audit"]:
        title = (f"this file is the {part['part']} of {article} {part['layout']}: audit the folder "
                 f"{part['folder']} for the whole picture")
        fix = (f"Run torchdoctor checkpoint-audit {part['folder']} — the folder is read as one checkpoint "
               "(model, optimizer, scheduler, RNG state together).")
    elif part["layout"]:  # DeepSpeed: the folder is not read as one checkpoint; say where the rest is
        title = (f"this file is the {part['part']} of {article} {part['layout']}: the other parts are the files "
                 f"beside it in {part['folder']}, so a missing model or optimizer here is expected")
        fix = ("Audit each file of the folder (the model states file holds the weights, the per-rank "
               "optim_states files the optimizer shards); for one file with the full weights, consolidate them "
               "first (DeepSpeed's zero_to_fp32.py) and audit its output.")
    else:
        title = (f"this file holds only the {part['part']}: one part of a checkpoint whose model weights are "
                 "saved in another file")
        fix = ("Audit the file or folder that holds the model weights too; if the parts live in one folder, "
               "pass the folder. Nothing is wrong with this file on its own.")
    ev_ = {"part": part["part"], "recognised": sorted({f"{p or '<root>'}: {r}" for p, r in
                                                         ev.roles.role_of.items()})[:MAX_ROLES_LISTED] or "nothing"}
    if part["layout"]:
        ev_["layout"] = part["layout"]
        ev_["folder"] = part["folder"]
        ev_["siblings"] = part.get("siblings", [])
    return [finding("ckpt-part-file", title, ev_, fix=fix, severity="info")]
