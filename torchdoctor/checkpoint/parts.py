"""A file that is one part of a checkpoint (only the optimizer, scheduler, scaler or RNG state).

``torch.save(optimizer.state_dict(), "optimizer.bin")`` (accelerate), ``scheduler.pt`` (the
Hugging Face Trainer) or ``random_states_0.pkl`` hold one part of a checkpoint whose model
weights lie in another file. Audited alone, such a file lacks a model *by design*: reporting
``ckpt-missing-model`` or ``ckpt-missing-optimizer`` for it is a false alarm. It is a part when

* its content is one part and nothing else (the root is an optimizer ``state_dict``, an LR
  scheduler's, a GradScaler's, or a dict of RNG states with at most a counter beside them), or
* its folder is a known multi-file layout (``layout.py``: accelerate, Trainer, DeepSpeed, FSDP,
  DCP), whatever it holds — even the model file there is only the weights of a larger whole.

A derivation step of the audit (``derive.py``): :func:`part_of` says what part the file is; the
rule ``ckpt-part-file`` (``torchdoctor/rules/checkpoint_parts.py``) raises one info finding that
says what the part is and which folder to audit, and the rules about what a whole checkpoint must
hold are skipped for it.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.values import TensorInfo
from torchdoctor.checkpoint.walk import children, join

_ROOT_KINDS = {"optimizer": "optimizer state", "scheduler": "LR-scheduler state", "scaler": "GradScaler state",
               "scaler (disabled)": "GradScaler state (disabled scaler)",
               "config": "training config"}  # a pickled TrainingArguments / argparse.Namespace (training_args.bin)


def _scalar(v: Any) -> bool:
    """A counter, flag or seed beside RNG states (an empty list: accelerate's CUDA states on a CPU run)."""
    return v is None or isinstance(v, (bool, int, float, str)) or (isinstance(v, TensorInfo) and v.numel <= 1) \
        or (isinstance(v, (list, tuple, dict)) and not v)


def content_part(ev) -> str | None:
    """What part of a checkpoint the file's content alone is, or None (it holds weights, or several parts)."""
    r = ev.roles
    if r.model is not None and r.model.tensors:
        return None
    root_role = r.role_of.get("")
    if root_role in _ROOT_KINDS:
        return _ROOT_KINDS[root_role]
    if root_role and root_role.startswith("rng"):
        return "RNG state"
    root = ev.contents.root
    if r.rng and not (r.optimizers or r.schedulers or r.scalers or r.extra_weights) and isinstance(root, dict):
        roles = [r.role_of.get(join("", k)) for k, _v in children(root)]
        if all((role or "").startswith(("rng", "progress")) or (role is None and _scalar(v))
               for role, (_k, v) in zip(roles, children(root))):
            return "RNG state"
    return None


def _kind_in_layout(ev, lay: dict) -> str:
    """What a file of a known layout holds, when its content alone is not one recognised part."""
    r = ev.roles
    if r.model is not None and r.model.tensors:
        return "model weights"
    if lay["name"] == "dcp" and ev.contents.path.endswith(".distcp"):
        return "tensor data shard"  # items stored by offset; the folder's .metadata says what they are
    if r.optimizers:
        return "optimizer state"  # e.g. DeepSpeed's *_optim_states.pt (nested under optimizer_state_dict)
    if r.schedulers:
        return "LR-scheduler state"
    if r.rng:
        return "RNG state"
    if r.progress:
        return "progress and bookkeeping state"  # Lightning's meta.pt beside a DCP folder
    return "non-weights state"


def part_of(ev) -> dict | None:
    """``{"part", "layout", "folder"}`` when the audited file is one part of a checkpoint, else None."""
    if ev.contents.format in ("directory", "dcp", "hf-index"):
        return None
    kind = content_part(ev)
    lay = ev.contents.layout
    if kind is None and lay is None:
        return None
    if kind is None:
        kind = _kind_in_layout(ev, lay)
    out = {"part": kind, "layout": lay["what"] if lay else None, "folder": lay["folder"] if lay else None,
           "folder_audit": bool(lay and lay.get("folder_audit"))}
    if lay:
        out["siblings"] = lay["evidence"]
    return out
