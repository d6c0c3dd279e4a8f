"""A live save as the checkpoint family's evidence, so that its rules decide (no second logic).

The ``save`` event (``instruments/save_audit_describe.py``) carries the roles the family's
recogniser found in the saved object, in a JSON summary. :func:`checkpoint_evidence` rebuilds
from it the :class:`~torchdoctor.checkpoint.roles.Roles` those rules read — optimizer param
groups (``lr``, ``initial_lr``) and whether their state has a ``step``, schedulers, scalers, RNG
states, progress counters, config, float16 signs — and what the file audit derives from them
(``mode`` through :func:`torchdoctor.checkpoint.derive.mode_of`: a training snapshot or a weights
export; which generators a present RNG state lacks). The model role keeps only its presence:
no family rule reads the saved tensors of a model.

Live facts that a file cannot show enter as measured evidence: an *enabled* GradScaler that is
alive at the save is a float16 sign (the file audit looks for the same thing in config flags),
and a model training on CUDA makes a missing CUDA generator state count (the file audit infers
it from CUDA tensors in the file).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.derive import mode_of
from torchdoctor.checkpoint.evidence import CheckpointEvidence
from torchdoctor.checkpoint.roles import ModelRole, OptimizerRole, Roles


def live_scaler_sign(save: dict) -> str | None:
    scalers = [s for s in (save.get("live") or {}).get("scalers") or [] if s.get("enabled")]
    return f"an enabled {scalers[0].get('cls', 'GradScaler')} is live (float16 loss scaling)" if scalers else None


def live_cuda(save: dict) -> list[str]:
    return sorted({str(m.get("device")) for m in (save.get("live") or {}).get("models") or []
                   if str(m.get("device", "")).startswith("cuda")})


def roles_of(save: dict) -> Roles:
    s = save.get("roles") or {}
    r = Roles()
    models = s.get("models") or []
    if models:
        m = models[0]
        r.model = ModelRole(str(m.get("path", "")), dict.fromkeys(range(min(1, int(m.get("keys") or 0)))),
                            full_pickle_class=m.get("pickled"))
        r.extra_weights = [ModelRole(str(x.get("path", "")), {}) for x in models[1:]]
    for o in s.get("optimizers") or []:
        groups = [dict(g) for g in o.get("groups") or []]
        state = {0: {"step": 0}} if o.get("state_has_step") else {}
        r.optimizers.append(OptimizerRole(str(o.get("path", "")), state, groups, []))
    r.schedulers = list(s.get("schedulers") or [])
    r.scalers = list(s.get("scalers") or [])
    r.empty_scalers = list(s.get("empty_scalers") or [])
    r.rng = dict(s.get("rng") or {})
    r.progress = dict(s.get("progress") or {})
    r.config = list(s.get("config") or [])
    r.fp16_signs = list(s.get("fp16_signs") or [])
    r.bf16_signs = list(s.get("bf16_signs") or [])
    sign = live_scaler_sign(save)
    if sign and not r.scalers:
        r.fp16_signs.append(sign)
    return r


def checkpoint_evidence(save: dict, expect: str = "auto") -> CheckpointEvidence:
    """The family's evidence for one described save (``expect``: auto, or resume for the resume check)."""
    ev = CheckpointEvidence(contents=None, roles=roles_of(save), expect=expect)
    ev.mode = mode_of(ev)
    cuda = sorted(set((save.get("roles") or {}).get("cuda_devices") or []) | set(live_cuda(save)))
    ev.cuda_devices = cuda
    r = ev.roles
    if r.rng:  # as checkpoint/derive.py derives it from the file
        ev.rng_missing = [name for name, absent in (("torch CPU", "torch" not in r.rng),
                                                     ("CUDA", bool(cuda) and "cuda" not in r.rng)) if absent]
    return ev


def holds(save: dict) -> list[str]:
    """What the save holds, in words: ["model", "optimizer", "scheduler", "epoch", ...]."""
    s = save.get("roles") or {}
    out = []
    for name, key in (("model", "models"), ("optimizer", "optimizers"), ("scheduler", "schedulers"),
                      ("scaler", "scalers"), ("config", "config")):
        if s.get(key):
            out.append(name if len(s[key]) == 1 else f"{len(s[key])} {name}s")
    if s.get("rng"):
        out.append("rng (" + ", ".join(sorted(s["rng"])) + ")")
    out += [f"{k}" for k in list(s.get("progress") or {})[:3]]
    return out


def live_names(save: dict, kind: str, only: Any = None) -> list[str]:
    items = (save.get("live") or {}).get(kind) or []
    return [str(x.get("cls", "?")) for i, x in enumerate(items) if only is None or only(i, x)]
