"""A live save as the checkpoint family's evidence, so that its rules decide (no second logic).

The ``save`` event (``instruments/save_audit/save_audit_describe.py``) carries the roles the family's
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
    part = (save.get("roles") or {}).get("part")
    if part:  # the save alone is one part (only an optimizer state, RNG states...): as checkpoint/parts.py
        ev.part = {"part": part, "layout": None, "folder": None, "folder_audit": False}
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


_LISTS = ("models", "optimizers", "schedulers", "scalers", "empty_scalers", "config", "fp16_signs", "bf16_signs",
          "cuda_devices")


def checkpoints(saves: list[dict], late_layouts: list, last_per_site: bool = True) -> list[dict]:
    """The checkpoints the script wrote: described saves to files or streams, those made at one step
    into one folder merged into one (accelerate and hand-written loops save model, optimizer and
    scheduler to separate files), each with the multi-file layout its folder turned out to have
    (``layout``: at the save, or at the end of the run). Per call site of a checkpoint's first save,
    the last such checkpoint, in site order (``last_per_site=False``: all, in save order)."""
    late = {(str(w), n): lay for w, n, lay in late_layouts or [] if lay}
    groups: dict[tuple, list[dict]] = {}
    for s in saves:
        if s.get("target") == "memory" or not isinstance(s.get("roles"), dict):
            continue
        key = (s.get("step"), s["folder"]) if s.get("folder") else (s.get("step"), s.get("where"), s.get("n"))
        groups.setdefault(key, []).append(s)
    every, by_site = [], {}
    for group in groups.values():
        ck = merge(group)
        ck["layout"] = next((s.get("layout") or late.get((str(s.get("where")), s.get("n"))) for s in group
                             if s.get("layout") or late.get((str(s.get("where")), s.get("n")))), None)
        every.append(ck)
        by_site.pop(str(ck.get("where")), None)
        by_site[str(ck.get("where"))] = ck
    return list(by_site.values()) if last_per_site else every


def merge(group: list[dict]) -> dict:
    """One checkpoint from the saves of one step into one folder (the first save names it; the
    resume check restarts after the last one: ``reset_at`` [where, n])."""
    last = group[-1]
    if len(group) == 1:
        return {**last, "reset_at": [last.get("where"), last.get("n")]}
    first = dict(group[0])
    roles: dict = {k: [] for k in _LISTS}
    roles.update(rng={}, progress={}, part=None)
    for s in group:
        r = s.get("roles") or {}
        for k in _LISTS:
            roles[k] += [x for x in r.get(k) or [] if x not in roles[k]]
        roles["rng"].update(r.get("rng") or {})
        roles["progress"].update(r.get("progress") or {})
    if not roles["models"]:  # several parts and still no weights: one part of a larger whole
        roles["part"] = next((s["roles"].get("part") for s in group if s["roles"].get("part")), None)
    matched: dict = {}
    for kind in ("models", "optimizers"):
        cols = [(s.get("matched") or {}).get(kind) or [] for s in group]
        width = max(len(c) for c in cols)
        matched[kind] = [next((c[i] for c in cols if i < len(c) and c[i]), None) for i in range(width)]
    first.update(roles=roles, matched=matched, live=last.get("live"), reset_at=[last.get("where"), last.get("n")],
                 files=[s.get("name") for s in group], sites=sorted({str(s.get("where")) for s in group}))
    return first
