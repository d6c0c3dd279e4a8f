"""Checkpoint rules on the weights: presence, NaN/Inf, wrapper prefixes, devices, fit to the model.

Probe ``checkpoint-audit``; the evidence is :class:`torchdoctor.checkpoint.evidence.CheckpointEvidence`.
The scan split by tensor role, the key comparison with ``--model``, the optimizer-vs-parameters
comparison and the wrapper prefixes were derived once when the evidence was built
(``checkpoint/derive.py``); each rule only reads them.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.checkpoint.derive import describe_hit
from torchdoctor.checkpoint.evidence import MAX_LISTED, short
from torchdoctor.checkpoint.walk import iter_nodes, iter_tensors
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import CHECKPOINTING

MAX_KEYS_LISTED = 8  # missing / unexpected / mis-shaped keys listed by ckpt-model-mismatch
MAX_PROBLEMS_LISTED = 6  # mismatches listed by ckpt-optimizer-mismatch

MISSING_MODEL = declare(
    "ckpt-missing-model", CHECKPOINTING, "error", "no model weights found",
    thresholds={"MAX_LISTED": MAX_LISTED})
NONFINITE_WEIGHTS = declare(
    "ckpt-nonfinite-weights", CHECKPOINTING, "error", "NaN/Inf in saved tensors: which ones",
    thresholds={"MAX_LISTED": MAX_LISTED})
WRAPPER_PREFIX = declare(
    "ckpt-wrapper-prefix", CHECKPOINTING, "info", "keys carry `module.` (DDP) or `_orig_mod.` (torch.compile) prefixes")
OPTIMIZER_MISMATCH = declare(
    "ckpt-optimizer-mismatch", CHECKPOINTING, "error",
    "optimizer state does not match the model's parameters (count or shapes)",
    thresholds={"MAX_PROBLEMS_LISTED": MAX_PROBLEMS_LISTED})
DEVICE_TENSORS = declare("ckpt-device-tensors", CHECKPOINTING, "info", "tensors saved on CUDA devices")
MODEL_MISMATCH = declare(
    "ckpt-model-mismatch", CHECKPOINTING, "error",
    "the state_dict does not fit the model given with --model: missing/unexpected keys, shape mismatches",
    thresholds={"MAX_KEYS_LISTED": MAX_KEYS_LISTED})

PROBES = {"checkpoint-audit"}


@rule("ckpt-missing-model", probes=PROBES, needs={"contents", "roles", "part"}, raises=[MISSING_MODEL])
def missing_model(ev) -> list[Finding]:
    m = ev.roles.model
    if m is None or not m.tensors:
        if ev.part:  # an optimizer.bin / random_states_0.pkl holds no model by design
            raise NotApplicable(f"one part of a checkpoint ({ev.part['part']}): the model weights are in another file")
        top = [k for k, _v, d in iter_nodes(ev.contents.root, max_depth=1) if d == 1]
        found = [f"{p}: {r}" for p, r in ev.roles.role_of.items()]
        return [finding(
            "ckpt-missing-model",
            "no model weights found: no state_dict (a mapping of names to tensors) and no pickled module",
            {"top_level_keys": short(top), "recognised": short(found) or "nothing"},
            fix="Save the weights with the rest: {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), "
                "...}. If they are in another file, audit that file.",
        )]
    empty = [k for k, t in m.tensors.items() if not t.data() and t.device == "meta"]
    if empty and len(empty) == len(m.tensors):
        return [finding(
            "ckpt-missing-model",
            f"the model's {len(empty)} tensors are on the meta device: the file holds shapes, not weights",
            {"model": m.path or "<root>", "meta_tensors": len(empty), "first": empty[0]},
            fix="Materialise the model before saving (model.to_empty(device=...) then load or initialise the "
                "weights), and save its state_dict again.",
        )]
    return []


@rule("ckpt-nonfinite-weights", probes=PROBES, needs={"scan", "nonfinite"}, raises=[NONFINITE_WEIGHTS])
def nonfinite_weights(ev) -> list[Finding]:
    s = ev.scan
    if s is None or s.skipped_reason:
        raise NotApplicable(ev.scan_skip or (s.skipped_reason if s else "scan off"))
    if "non-finite split" in ev.derive_failed:
        raise NotApplicable(ev.derive_failed["non-finite split"])
    hits = ev.nonfinite
    if not hits:
        return []
    first = hits[0][0]
    n_model = sum(1 for _h, role in hits if role == "model")
    n_opt = sum(1 for _h, role in hits if role == "optimizer")
    return [finding(
        "ckpt-nonfinite-weights",
        f"NaN/Inf in {len(hits)} saved weight/optimizer tensor{'s' if len(hits) != 1 else ''} "
        f"({n_model} model, {n_opt} optimizer state, {len(hits) - n_model - n_opt} other weights): first {first.name}",
        {"tensors": short([describe_hit(h) for h, _role in hits]), "first_bad_index": first.first_index},
        fix="Do not resume from or deploy this checkpoint: go back to the last finite one. Find where training "
            "diverged with `torchdoctor nan SCRIPT`, and check for finiteness before saving.",
    )]


@rule("ckpt-wrapper-prefix", probes=PROBES, needs={"roles", "wrappers", "model_fit"}, raises=[WRAPPER_PREFIX])
def wrapper_prefix(ev) -> list[Finding]:
    if "wrapper prefixes" in ev.derive_failed:
        raise NotApplicable(ev.derive_failed["wrapper prefixes"])
    if not ev.wrappers:
        return []
    keys = list(ev.roles.model.tensors)
    sev = "warning" if ev.model_spec is not None and ev.prefix_only_fit else None
    p, n, who = ev.wrappers[0]
    return [finding(
        "ckpt-wrapper-prefix",
        f"{n} of {len(keys)} model keys carry '{p}' ({who}): a plain model's load_state_dict rejects them"
        + (" (checked against --model)" if sev else ""),
        {"prefixes": [f"'{q}' on {k} keys ({w})" for q, k, w in ev.wrappers], "example": next(
            (k for k in keys if p in k), keys[0])},
        fix=f"Strip it when loading: torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, '{p}'); "
            "better, save the unwrapped module's state_dict (model.module / model._orig_mod).",
        severity=sev,
    )]


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 1 << 80 else f"<{n.bit_length()}-bit byte count>"


@rule("ckpt-device-tensors", probes=PROBES, needs={"contents"}, raises=[DEVICE_TENSORS])
def device_tensors(ev) -> list[Finding]:
    devs: dict[str, list] = {}
    for _n, t in iter_tensors(ev.tree):
        if t.device not in ("cpu", "meta"):
            d = devs.setdefault(t.device, [0, 0])
            d[0] += 1
            d[1] += t.nbytes
    if not devs:
        return []
    n = sum(v[0] for v in devs.values())
    return [finding(
        "ckpt-device-tensors",
        f"{n} tensors were saved on {', '.join(sorted(devs))}: loading needs that device or map_location",
        {"devices": {d: f"{v[0]} tensors, {mib(v[1])}" for d, v in sorted(devs.items())}},
        fix="Load with torch.load(path, map_location='cpu') (or your device); to make files device-neutral, "
            "save tensors moved to CPU.",
    )]


# -- against the model ------------------------------------------------------------------

@rule("ckpt-optimizer-mismatch", probes=PROBES, needs={"roles", "model_spec", "optimizer_fit"},
      raises=[OPTIMIZER_MISMATCH])
def optimizer_mismatch(ev) -> list[Finding]:
    r, spec = ev.roles, ev.model_spec
    if not r.optimizers:
        raise NotApplicable("no optimizer state")
    if spec is None and (r.model is None or not r.model.tensors):
        raise NotApplicable("no model weights to compare the optimizer state with")
    if "optimizer fit" in ev.derive_failed:
        raise NotApplicable(ev.derive_failed["optimizer fit"])
    bad = [(o, res) for o, res in ev.optimizer_fit if res.problems]
    if not bad:
        return []
    o, res = bad[0]
    return [finding(
        "ckpt-optimizer-mismatch",
        f"optimizer state does not fit the {'model given with --model' if spec else 'saved model'}: "
        f"{res.problems[0]}",
        {"optimizer": o.path or "<root>", "params_in_param_groups": res.n_ids,
         "model_parameters": res.n_params, "problems": short(res.problems, MAX_PROBLEMS_LISTED)},
        fix="The optimizer was saved for a different model (or parameter order). Rebuild the optimizer over "
            "the same parameters in the same order before load_state_dict, or drop the optimizer state and "
            "restart it.",
    )]


@rule("ckpt-model-mismatch", probes=PROBES, needs={"roles", "model_spec", "model_fit"}, raises=[MODEL_MISMATCH])
def model_mismatch(ev) -> list[Finding]:
    spec = ev.model_spec
    if spec is None:
        raise NotApplicable("needs --model MODULE:FACTORY")
    m = ev.roles.model
    if m is None or not m.tensors:
        raise NotApplicable("no model weights in the checkpoint")
    res = ev.model_fit
    if res is None:
        raise NotApplicable(ev.derive_failed.get("model fit", "the keys were not compared"))
    if ev.prefix_only_fit:
        return []  # only a wrapper prefix differs: ckpt-wrapper-prefix says it
    if not res.missing and not res.unexpected and not res.shape and res.transform is None:
        return []
    ev_: dict[str, Any] = {"model": spec.source, "matched": f"{res.matched} of {len(spec.state)} model keys"}
    if res.transform:
        ev_["keys_fit_better_after"] = f"{res.transform} ({res.matched_after} keys match)"
    if res.missing:
        ev_["missing_keys"] = short(res.missing, MAX_KEYS_LISTED)
    if res.unexpected:
        ev_["unexpected_keys"] = short(res.unexpected, MAX_KEYS_LISTED)
    if res.shape:
        ev_["shape_mismatches"] = short([f"{k}: checkpoint {a} vs model {b}" for k, a, b in res.shape],
                                        MAX_KEYS_LISTED)
    parts = []
    if res.missing:
        parts.append(f"{len(res.missing)} missing")
    if res.unexpected:
        parts.append(f"{len(res.unexpected)} unexpected")
    if res.shape:
        parts.append(f"{len(res.shape)} shape mismatches")
    title = "the state_dict does not fit --model: " + (", ".join(parts) or res.transform or "keys differ")
    fix = "model.load_state_dict(sd) (strict) will raise. "
    if res.transform:
        fix += f"Rewrite the keys first ({res.transform}). "
    if res.shape:
        fix += "Shape mismatches mean a different architecture or config (e.g. vocab size, layer width). "
    fix += "For intentional partial loads use load_state_dict(sd, strict=False) and check what it returns."
    return [finding("ckpt-model-mismatch", title, ev_, fix=fix)]
