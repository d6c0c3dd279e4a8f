"""Rules on the weights themselves: presence, NaN/Inf, wrapper prefixes, devices, fit to the model."""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.compare import WRAPPER_SEGMENTS, compare_optimizer, compare_state
from torchdoctor.checkpoint.rules_base import MAX_LIST, Evidence, Judgment, short
from torchdoctor.checkpoint.values import TensorInfo
from torchdoctor.checkpoint.walk import iter_nodes, iter_tensors
from torchdoctor.findings import finding


def rule_missing_model(ev: Evidence, j: Judgment) -> None:
    m = ev.roles.model
    top = [k for k, _v, d in iter_nodes(ev.contents.root, max_depth=1) if d == 1]
    if m is None or not m.tensors:
        if j.facts.get("part"):  # an optimizer.bin / random_states_0.pkl holds no model by design
            j.skipped.append(("ckpt-missing-model", f"one part of a checkpoint ({j.facts['part']['part']}): "
                                                    "the model weights are in another file"))
            return
        found = [f"{p}: {r}" for p, r in ev.roles.role_of.items()]
        j.findings.append(finding(
            "ckpt-missing-model",
            "no model weights found: no state_dict (a mapping of names to tensors) and no pickled module",
            {"top_level_keys": short(top), "recognised": short(found) or "nothing"},
            fix="Save the weights with the rest: {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), "
                "...}. If they are in another file, audit that file.",
        ))
        return
    empty = [k for k, t in m.tensors.items() if not t.data() and t.device == "meta"]
    if empty and len(empty) == len(m.tensors):
        j.findings.append(finding(
            "ckpt-missing-model",
            f"the model's {len(empty)} tensors are on the meta device: the file holds shapes, not weights",
            {"model": m.path or "<root>", "meta_tensors": len(empty), "first": empty[0]},
            fix="Materialise the model before saving (model.to_empty(device=...) then load or initialise the "
                "weights), and save its state_dict again.",
        ))


def weight_role(name: str, ev: Evidence) -> str | None:
    """"model" / "weights" / "optimizer" when tensor ``name`` belongs to one; None for bookkeeping.

    Callbacks and metrics keep non-finite sentinels on purpose (Lightning's ModelCheckpoint
    ``kth_value`` and EarlyStopping ``best_score`` start at ``tensor(inf)``); they are not weights.
    """
    r = ev.roles

    def under(path: str) -> bool:
        return path == "" or name == path or name.startswith(path + ".")

    if r.model is not None and under(r.model.path):
        return "model"
    if any(under(m.path) for m in r.extra_weights):
        return "weights"
    if any(under(o.path) for o in r.optimizers):
        return "optimizer"
    return None


def rule_nonfinite(ev: Evidence, j: Judgment) -> None:
    s = ev.scan
    if s is None or s.skipped_reason:
        j.skipped.append(("ckpt-nonfinite-weights", ev.scan_skip or (s.skipped_reason if s else "scan off")))
        return
    masks = [h for h in s.hits if h.nan == 0 and h.posinf == 0 and "mask" in h.name.lower()]
    roles = {id(h): weight_role(h.name, ev) for h in s.hits}
    other = [h for h in s.hits if h not in masks and roles[id(h)] is None]
    hits = [h for h in s.hits if h not in masks and roles[id(h)] is not None]
    if masks:
        j.facts["intentional_neg_inf"] = [h.name for h in masks[:MAX_LIST]]
    if other:  # reported as a fact, not a finding: e.g. best_model_score = inf before the first validation
        j.facts["nonfinite_bookkeeping"] = [_desc(h) for h in other[:MAX_LIST]]
    if not hits:
        return
    first = hits[0]
    n_model = sum(1 for h in hits if roles[id(h)] == "model")
    n_opt = sum(1 for h in hits if roles[id(h)] == "optimizer")
    j.findings.append(finding(
        "ckpt-nonfinite-weights",
        f"NaN/Inf in {len(hits)} saved weight/optimizer tensor{'s' if len(hits) != 1 else ''} "
        f"({n_model} model, {n_opt} optimizer state, {len(hits) - n_model - n_opt} other weights): first {first.name}",
        {"tensors": short([_desc(h) for h in hits]), "first_bad_index": first.first_index},
        fix="Do not resume from or deploy this checkpoint: go back to the last finite one. Find where training "
            "diverged with `torchdoctor nan SCRIPT`, and check for finiteness before saving.",
    ))


def _desc(h) -> str:
    return f"{h.name} {h.dtype}{list(h.shape)}: " + ", ".join(
        f"{n} {w}" for n, w in ((h.nan, "NaN"), (h.posinf, "+Inf"), (h.neginf, "-Inf")) if n)


def rule_wrapper_prefix(ev: Evidence, j: Judgment) -> None:
    m = ev.roles.model
    if m is None or not m.tensors:
        return
    keys = list(m.tensors)
    found = []
    if all(k.startswith("module.") for k in keys):
        found.append(("module.", len(keys), "DistributedDataParallel/DataParallel"))
    for seg in WRAPPER_SEGMENTS:
        n = sum(1 for k in keys if seg in k)
        if n:
            found.append((seg, n, {"_orig_mod.": "torch.compile", "_fsdp_wrapped_module.": "FSDP (v1)",
                                   "_checkpoint_wrapped_module.": "activation checkpoint wrapper"}[seg]))
    if not found:
        return
    j.facts["wrapper_prefixes"] = [p for p, _n, _w in found]
    if ev.model_spec is not None and j.facts.get("model_keys_fit_after_prefix"):
        sev = "warning"
    else:
        sev = None
    p, n, who = found[0]
    j.findings.append(finding(
        "ckpt-wrapper-prefix",
        f"{n} of {len(keys)} model keys carry '{p}' ({who}): a plain model's load_state_dict rejects them"
        + (" (checked against --model)" if sev else ""),
        {"prefixes": [f"'{q}' on {k} keys ({w})" for q, k, w in found], "example": next(
            (k for k in keys if p in k), keys[0])},
        fix=f"Strip it when loading: torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(sd, '{p}'); "
            "better, save the unwrapped module's state_dict (model.module / model._orig_mod).",
        severity=sev,
    ))


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 1 << 80 else f"<{n.bit_length()}-bit byte count>"


def rule_device_tensors(ev: Evidence, j: Judgment) -> None:
    root = ev.stub_root if ev.stub_root is not None else ev.contents.root
    devs: dict[str, list] = {}
    for _n, t in iter_tensors(root):
        if t.device not in ("cpu", "meta"):
            d = devs.setdefault(t.device, [0, 0])
            d[0] += 1
            d[1] += t.nbytes
    if not devs:
        return
    n = sum(v[0] for v in devs.values())
    j.findings.append(finding(
        "ckpt-device-tensors",
        f"{n} tensors were saved on {', '.join(sorted(devs))}: loading needs that device or map_location",
        {"devices": {d: f"{v[0]} tensors, {mib(v[1])}" for d, v in sorted(devs.items())}},
        fix="Load with torch.load(path, map_location='cpu') (or your device); to make files device-neutral, "
            "save tensors moved to CPU.",
    ))


# -- against the model ------------------------------------------------------------------

def _float_params(m_tensors: dict[str, TensorInfo]) -> tuple[list[tuple[str, tuple]], int]:
    """Checkpoint tensors that could be parameters (floating, storage-deduplicated)."""
    out, seen = [], set()
    for k, t in m_tensors.items():
        if not t.is_float:
            continue
        st = t.data()
        ident = (st[0].key, t.storage_offset, tuple(t.shape)) if st else ("?", k)
        if ident in seen:
            continue
        seen.add(ident)
        out.append((k, tuple(t.shape)))
    return out, len(out)


def rule_optimizer_mismatch(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if not r.optimizers:
        j.skipped.append(("ckpt-optimizer-mismatch", "no optimizer state"))
        return
    spec = ev.model_spec
    if spec is not None:
        params = [(n, s) for n, s, _g in spec.params]
        exact = True
        n_params = len(params)
    elif r.model is not None and r.model.tensors:
        params, n_params = _float_params(r.model.tensors)
        exact = False
    else:
        j.skipped.append(("ckpt-optimizer-mismatch", "no model weights to compare the optimizer state with"))
        return
    results = []
    for opt in r.optimizers:
        ids = opt.param_ids
        names = params
        if ids and all(isinstance(i, str) for i in ids) and spec is None and r.model is not None:
            names = [(k, tuple(t.shape)) for k, t in r.model.tensors.items()]
        res = compare_optimizer(opt.state, ids, names, exact_order=exact, unique_params=n_params)
        if spec is not None and res.problems and len(ids) < len(params):
            trainable = [(n, s) for n, s, g in spec.params if g]
            if len(trainable) == len(ids):
                res = compare_optimizer(opt.state, ids, trainable, exact_order=True)
        results.append((opt, res))
        if res.notes:
            j.facts.setdefault("optimizer_notes", []).extend(res.notes)
    bad = [(o, res) for o, res in results if res.problems]
    j.facts["optimizer_vs_params"] = [{"optimizer": o.path or "<root>", "params_in_groups": res.n_ids,
                                       "model_params": res.n_params, "against": "--model" if spec else "checkpoint"}
                                      for o, res in results]
    if not bad:
        return
    o, res = bad[0]
    j.findings.append(finding(
        "ckpt-optimizer-mismatch",
        f"optimizer state does not fit the {'model given with --model' if spec else 'saved model'}: "
        f"{res.problems[0]}",
        {"optimizer": o.path or "<root>", "params_in_param_groups": res.n_ids,
         "model_parameters": res.n_params, "problems": short(res.problems, 6)},
        fix="The optimizer was saved for a different model (or parameter order). Rebuild the optimizer over "
            "the same parameters in the same order before load_state_dict, or drop the optimizer state and "
            "restart it.",
    ))


def rule_model_mismatch(ev: Evidence, j: Judgment) -> None:
    spec = ev.model_spec
    if spec is None:
        j.skipped.append(("ckpt-model-mismatch", "needs --model MODULE:FACTORY"))
        return
    m = ev.roles.model
    if m is None or not m.tensors:
        j.skipped.append(("ckpt-model-mismatch", "no model weights in the checkpoint"))
        return
    ck = {k: (tuple(t.shape), t.dtype) for k, t in m.tensors.items()}
    res = compare_state(ck, spec.state)
    j.facts["model_compare"] = {
        "model": spec.source, "model_keys": len(spec.state), "checkpoint_keys": len(ck), "matched": res.matched,
        "missing": len(res.missing), "unexpected": len(res.unexpected), "shape_mismatches": len(res.shape),
        "dtype_differences": [f"{k}: {a} → {b}" for k, a, b in res.dtype[:MAX_LIST]],
        "key_rewrite": res.transform,
    }
    prefix_only = res.transform is not None and not res.missing and not res.unexpected and not res.shape
    if prefix_only and res.transform.startswith(("strip 'module.'", "strip '_orig_mod.'", "remove")):
        j.facts["model_keys_fit_after_prefix"] = res.transform
        return  # the wrapper-prefix finding says it (rules run in order: model before prefix)
    if not res.missing and not res.unexpected and not res.shape and res.transform is None:
        return
    ev_: dict[str, Any] = {"model": spec.source, "matched": f"{res.matched} of {len(spec.state)} model keys"}
    if res.transform:
        ev_["keys_fit_better_after"] = f"{res.transform} ({res.matched_after} keys match)"
    if res.missing:
        ev_["missing_keys"] = short(res.missing, 8)
    if res.unexpected:
        ev_["unexpected_keys"] = short(res.unexpected, 8)
    if res.shape:
        ev_["shape_mismatches"] = short([f"{k}: checkpoint {a} vs model {b}" for k, a, b in res.shape], 8)
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
    j.findings.append(finding("ckpt-model-mismatch", title, ev_, fix=fix))
