"""Is a single checkpoint file one part of a known multi-file layout? (Looks at its siblings' names.)

Several frameworks write one checkpoint as a folder of files, each holding one part:

* accelerate ``save_state``: ``model.safetensors``, ``optimizer.bin``, ``scheduler.bin``,
  ``random_states_<rank>.pkl``, ``scaler.pt``, ``sampler.bin``;
* the Hugging Face Trainer: ``checkpoint-<step>/`` with ``optimizer.pt``, ``scheduler.pt``,
  ``rng_state[_<rank>].pth``, ``trainer_state.json``;
* DeepSpeed (also under Lightning's DeepSpeed strategy): ``mp_rank_00_model_states.pt`` and
  ``*zero_pp_rank_<r>_mp_rank_00_optim_states.pt``;
* accelerate FSDP: ``pytorch_model_fsdp_<n>.bin`` / ``optimizer_<n>.bin`` and ``*_fsdp_*`` entries;
* ``torch.distributed.checkpoint`` (also Lightning's FSDP sharded checkpoints): ``.metadata`` and
  ``__<rank>_<n>.distcp`` files (Lightning adds ``meta.pt``).

Auditing one of those files alone must not conclude that the checkpoint lacks a model or an
optimizer: the folder holds them. This module only reads the folder's *names* (no file is
opened); the rules decide what that means (``parts.py``, ``torchdoctor/rules/checkpoint_parts.py``).
"""

from __future__ import annotations

import os
import re

MAX_NAMES = 4096  # a huge folder is not listed past this many entries

_ACCELERATE = re.compile(r"^(random_states_\d+\.pkl|optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|sampler(_\d+)?\.bin|"
                         r"custom_checkpoint_\d+\.pkl)$")
# not training_args.bin alone: trainer.save_model() writes it beside the final weights (a whole export)
_TRAINER = re.compile(r"^(trainer_state\.json|rng_state(_\d+)?\.pth)$")
_DEEPSPEED = re.compile(r"(^|_)mp_rank_\d+_model_states\.pt$|zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt$")
_FSDP = re.compile(r"_fsdp(_|\.|$)|^optimizer_\d+(_rank\d+)?\.bin$")
_DCP = re.compile(r"^(\.metadata|__\d+\.metadata|__\d+_\d+\.distcp)$")
_TRAINER_DIR = re.compile(r"^checkpoint-\d+$")

LAYOUTS = (  # (name, what it is, pattern over sibling names)
    ("dcp", "torch.distributed.checkpoint (DCP) folder", _DCP),
    ("deepspeed", "DeepSpeed checkpoint", _DEEPSPEED),
    ("fsdp", "FSDP checkpoint (accelerate)", _FSDP),
    ("hf-trainer", "Hugging Face Trainer checkpoint", _TRAINER),
    ("accelerate", "accelerate save_state checkpoint", _ACCELERATE),
)


def sibling_layout(path: str) -> dict | None:
    """``{"name", "what", "folder", "evidence"}`` when ``path``'s folder is a known multi-file layout.

    ``evidence`` lists the sibling names (other than ``path`` itself) that identify it. A file
    alone in its folder, or among unrelated files, is no part (None).
    """
    folder = os.path.dirname(os.path.abspath(path))
    me = os.path.basename(path)
    try:
        with os.scandir(folder) as it:
            names = []
            for e in it:
                names.append(e.name)
                if len(names) >= MAX_NAMES:
                    break
    except OSError:
        return None
    others = sorted(n for n in names if n != me)
    for name, what, pat in LAYOUTS:
        hits = [n for n in others if pat.search(n)]
        if hits:
            return {"name": name, "what": what, "folder": folder, "evidence": hits[:6],
                    "folder_audit": _folder_reads_as_one(name, names)}
    if _TRAINER_DIR.match(os.path.basename(folder)) and any(n.endswith((".pt", ".pth", ".bin", ".safetensors"))
                                                            for n in others):
        return {"name": "hf-trainer", "what": "Hugging Face Trainer checkpoint", "folder": folder,
                "evidence": [f"folder name {os.path.basename(folder)}"],
                "folder_audit": _folder_reads_as_one("hf-trainer", names)}
    return None


def _folder_reads_as_one(layout: str, names: list[str]) -> bool:
    """Whether ``checkpoint-audit FOLDER`` reads this folder as one checkpoint (folders.read_dir's rule).

    DCP folders and folders with Trainer/accelerate state files are; a DeepSpeed folder is not (its
    ranks' files are read one by one).
    """
    from torchdoctor.checkpoint.limits import TRAINER_FILES

    if layout == "dcp":
        return True
    return any(n in TRAINER_FILES or n.startswith(("rng_state", "random_states_")) for n in names)
