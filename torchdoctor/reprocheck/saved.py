"""Which save the resume check restarts from, and which states that save lacks (pure, no torch).

Input: the ``save`` events of the baseline run (``instruments/save_audit/save_audit.py``), grouped as the
save audit groups them (``rules/checkpoint_saves_roles.py`` ``checkpoints``). The checkpoint
is the first save to a file or stream that the checkpoint family judges a training snapshot
(``rules/checkpoint_saves_roles.py``: the same decision as ``checkpoint-audit``), with at least
``MIN_AFTER`` training steps after it in the baseline; failing that, the first such weights-only
save (a resume from an export is a resume too: the check shows what it loses).

A state is missing when something live would need it and the save does not hold it:

* ``optimizer:<i>``: a live optimizer that holds state or is driven by a scheduler, matched to
  no saved optimizer state (``ckpt-missing-optimizer``);
* ``scheduler:<i>``: every live scheduler, when the save holds no scheduler state
  (``ckpt-missing-scheduler``);
* ``scaler:<i>``: every enabled live GradScaler, when the save holds no scaler state
  (``ckpt-missing-scaler``);
* ``rng:<kind>``: the global generators (torch CPU, CUDA when a model trains there, NumPy,
  Python) whose state the save does not hold (``ckpt-missing-rng``).

A progress counter cannot be restarted in the same process (it is a variable of the script's
loop): it is listed as not simulated, and judged by the save audit alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_AFTER = 2  # training steps after the save in the baseline, to replay at least this many
RNG_KINDS = ("torch", "cuda", "numpy", "python")


@dataclass
class Missing:
    state: str  # optimizer | scheduler | scaler | rng
    code: str
    keys: list[str] = field(default_factory=list)  # what the child resets (save_audit_reset.py)
    names: list[str] = field(default_factory=list)  # for people: "StepLR", "torch CPU generator"


def choose(saves: list[dict], last_step: int, late_layouts: list | None = None) -> dict | None:
    """The checkpoint to restart from: as the save audit sees them (``checkpoints``: the saves of one
    step into one folder merged; a framework's multi-file folder and a part saved alone left out)."""
    from torchdoctor.rules.checkpoint_saves_roles import checkpoint_evidence, checkpoints

    found = sorted(checkpoints(saves, late_layouts or [], last_per_site=False), key=lambda c: int(c.get("step") or 0))
    usable = [s for s in found if not s.get("layout") and not (s.get("roles") or {}).get("part")
              and 1 <= int(s.get("step") or 0) <= last_step - MIN_AFTER]
    snaps = [s for s in usable if checkpoint_evidence(s).mode == "resume"]
    return (snaps or usable or [None])[0]


def missing_states(save: dict) -> list[Missing]:
    roles, live = save.get("roles") or {}, save.get("live") or {}
    matched = (save.get("matched") or {}).get("optimizers") or []
    out: list[Missing] = []
    opts = [(i, o) for i, o in enumerate(live.get("optimizers") or [])
            if (o.get("stateful") or o.get("scheduled")) and (i >= len(matched) or matched[i] is None)]
    if opts:
        out.append(Missing("optimizer", "ckpt-missing-optimizer", [f"optimizer:{i}" for i, _ in opts],
                           [str(o.get("cls")) for _, o in opts]))
    scheds = live.get("schedulers") or []
    if scheds and not roles.get("schedulers"):
        out.append(Missing("scheduler", "ckpt-missing-scheduler", [f"scheduler:{i}" for i in range(len(scheds))],
                           [str(s.get("cls")) for s in scheds]))
    scalers = [(i, s) for i, s in enumerate(live.get("scalers") or []) if s.get("enabled")]
    if scalers and not roles.get("scalers"):
        out.append(Missing("scaler", "ckpt-missing-scaler", [f"scaler:{i}" for i, _ in scalers],
                           [str(s.get("cls")) for _, s in scalers]))
    cuda = any(str(m.get("device", "")).startswith("cuda") for m in live.get("models") or [])
    kinds = [k for k in RNG_KINDS if k not in (roles.get("rng") or {}) and (k != "cuda" or cuda)]
    if kinds:
        out.append(Missing("rng", "ckpt-missing-rng", [f"rng:{k}" for k in kinds],
                           [f"{k} generator" for k in kinds]))
    return out


def not_simulated(save: dict) -> list[str]:
    return [] if (save.get("roles") or {}).get("progress") else \
        ["progress counter: the loop's own variables restart only in a new process (judged by the save audit)"]
