"""What one ``torch.save`` holds, against the live training objects (the ``save`` event's payload).

1. :func:`~torchdoctor.instruments.save_audit.save_audit_mirror.mirror` turns the saved object into the
   checkpoint reader's value model (one bounded walk, no tensor data read);
2. the checkpoint family's recogniser (``checkpoint/roles.py`` ``recognise``) assigns roles —
   model weights, optimizer, scheduler, scaler, RNG states, progress counters, config — exactly
   as ``checkpoint-audit`` does for a file;
3. whether the saved object alone is one part of a checkpoint (only an optimizer, a scheduler,
   a scaler or RNG states: ``checkpoint/parts.py`` ``content_part``, as for a file);
4. each live model and optimizer is matched to a saved role: a model by the identity of its
   tensors (a ``state_dict()`` shares their storage; a whole-module save holds them) or else by
   its state_dict keys (a copy moved to another device), an optimizer by the identity of its
   per-parameter state (dicts or tensors) or else, among saved optimizer states that are no live
   optimizer's own, by the sizes of its param groups (each such state matched once).

The payload is JSON-safe and bounded (paths are the saved keys, cut at 200 characters, a few
entries per list): the rules rebuild the family's ``Roles`` from it (``rules/checkpoint_saves_roles.py``).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from torchdoctor.checkpoint.parts import content_part
from torchdoctor.checkpoint.roles import recognise
from torchdoctor.checkpoint.values import TensorInfo, plain
from torchdoctor.instruments.save_audit.save_audit_live import MAX_LIVE, Live, live_facts, models_with_weights
from torchdoctor.instruments.save_audit.save_audit_mirror import Mirror, mirror

MAX_LISTED = 8
MATCH_SHARE = 0.9  # a live model is "saved" when this share of its tensors (or keys) is in the save
PREFIXES = ("module.", "_orig_mod.")


def describe(obj: Any, ctx: Any, live: Live, counted: Any = None) -> dict:
    t0 = time.perf_counter()
    mi = mirror(obj)
    roles = recognise(mi.root)
    summary = roles_summary(roles, mi)
    summary["part"] = content_part(SimpleNamespace(roles=roles, contents=SimpleNamespace(root=mi.root)))
    facts = live_facts(ctx, live)
    if counted is not None and counted.calls:
        facts["counter_schedulers"] = counted.facts()
    out = {"roles": summary, "live": facts,
           "matched": {"models": _match_models(roles, mi, ctx)[:MAX_LIVE],
                       "optimizers": _match_optimizers(roles, mi, live.optimizers(ctx)[:MAX_LIVE])},
           "nodes": mi.nodes}
    if mi.truncated:
        out["truncated"] = mi.truncated
    out["describe_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return out


def roles_summary(r: Any, mi: Mirror) -> dict:
    models = ([r.model] if r.model is not None else []) + list(r.extra_weights)
    return {
        "models": [{"path": m.path, "keys": len(m.tensors), "pickled": m.full_pickle_class}
                   for m in models[:MAX_LISTED]],
        "optimizers": [{"path": o.path, "state_entries": len(o.state),
                        "state_has_step": any(isinstance(st, dict) and "step" in st for st in o.state.values()),
                        "groups": [{"params": len(g.get("params") or ()) if isinstance(g.get("params"), (list, tuple))
                                    else 0, "lr": plain(g.get("lr")) if not isinstance(g.get("lr"), TensorInfo)
                                    else "<tensor>",
                                    **({"initial_lr": _lr(g["initial_lr"])} if "initial_lr" in g else {})}
                                   for g in o.param_groups[:MAX_LISTED]]}
                       for o in r.optimizers[:MAX_LISTED]],
        "schedulers": r.schedulers[:MAX_LISTED],
        "scalers": r.scalers[:MAX_LISTED],
        "empty_scalers": r.empty_scalers[:MAX_LISTED],
        "rng": dict(r.rng),
        "progress": {k: v for k, v in list(r.progress.items())[:MAX_LISTED]},
        "config": r.config[:MAX_LISTED],
        "fp16_signs": r.fp16_signs[:MAX_LISTED],
        "bf16_signs": r.bf16_signs[:MAX_LISTED],
        "cuda_devices": sorted(d for d in mi.devices if d.startswith("cuda")),
    }


def _lr(v: Any) -> Any:
    return "<tensor>" if isinstance(v, TensorInfo) else plain(v)


def _strip(k: str) -> str:
    for p in PREFIXES:
        k = k.replace(p, "")
    return k


def _match_models(r: Any, mi: Mirror, ctx: Any) -> list:
    """Per live model (with weights): "identity", "keys" or None (not in the save)."""
    roles = ([r.model] if r.model is not None else []) + list(r.extra_weights)
    saved_ptrs = {mi.ptr[id(t)] for m in roles for t in m.tensors.values() if id(t) in mi.ptr}
    saved_keys = {_strip(k) for m in roles for k in m.tensors}
    out = []
    for model in models_with_weights(ctx):
        tensors = list(model.parameters())
        ptrs = [_ptr(p) for p in tensors]
        hit = sum(1 for p in ptrs if p is not None and p in saved_ptrs)
        if tensors and hit >= MATCH_SHARE * len(tensors):
            out.append("identity")
            continue
        keys = [_strip(k) for k, _ in model.named_parameters()]
        if keys and sum(1 for k in keys if k in saved_keys) >= MATCH_SHARE * len(keys):
            out.append("keys")
        else:
            out.append(None)
    return out


def _match_optimizers(r: Any, mi: Mirror, optimizers: list) -> list:
    """Per live optimizer: "identity", "groups" or None (its state is not in the save).

    "identity": a saved optimizer state holds this optimizer's own per-parameter state — the same
    state dicts (``state_dict()`` hands them out as they are) or tensors of the same storage.
    "groups": otherwise, a saved optimizer state that holds no live optimizer's state (a copy, one
    rebuilt from a file) with this optimizer's param-group sizes; each such state matches one live
    optimizer at most. A saved state that is a live optimizer's own never matches another by its
    sizes: two optimizers of equal group sizes, one saved, leave the other unmatched (missing)."""
    saved = [({id(st) for st in o.state.values()},
              {mi.ptr[id(t)] for st in o.state.values() if isinstance(st, dict)
               for t in st.values() if isinstance(t, TensorInfo) and id(t) in mi.ptr})
             for o in r.optimizers]
    out: list = [None] * len(optimizers)
    owned: set[int] = set()  # saved states that are some live optimizer's own
    for i, opt in enumerate(optimizers):
        states = [st for st in list(opt.state.values())[:64] if isinstance(st, dict)]
        nodes = {id(mi.node_of[id(st)]) for st in states if id(st) in mi.node_of}
        ptrs = {p for st in states for t in st.values() if _is_tensor(t) and t.dim() > 0
                for p in (_ptr(t),) if p is not None}
        mine = {j for j, (entries, saved_ptrs) in enumerate(saved) if nodes & entries or ptrs & saved_ptrs}
        if mine:
            owned |= mine
            out[i] = "identity"
    sigs = [[len(g.get("params") or ()) if isinstance(g.get("params"), (list, tuple)) else -1
             for g in o.param_groups] for o in r.optimizers]
    for i, opt in enumerate(optimizers):
        if out[i] is not None:
            continue
        sig = [len(g.get("params", ())) for g in opt.param_groups]
        j = next((j for j, s in enumerate(sigs) if s == sig and j not in owned), None)
        if j is not None:
            owned.add(j)
            out[i] = "groups"
    return out


def _is_tensor(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor)


def _ptr(t: Any) -> int | None:
    from torchdoctor.instruments.save_audit.save_audit_mirror import data_ptr

    return data_ptr(t)
