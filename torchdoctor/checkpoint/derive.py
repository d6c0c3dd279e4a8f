"""Facts derived once from a read checkpoint, before judging (see ``evidence.py``).

Each fact is computed here, from the evidence alone, so that no rule reads another rule's result:
what the file is for (``mode``: resume | weights | part, see ``--expect`` in docs/checkpoint.md),
whether it is one part of a multi-file checkpoint, the classified pickle globals, the fit of the
keys to ``--model``, the optimizer state against the parameters, the wrapper prefixes of the model
keys, the split of non-finite tensors into weights and bookkeeping, and what an RNG state lacks.
``facts`` gathers what the report shows under ``metrics.checkpoint.facts``, in a fixed order.

A fact whose derivation crashes on odd input is noted in ``derive_failed`` (the audit reports an
``internal-error`` for it) and the rules that need it say they could not judge.
"""

from __future__ import annotations

from typing import Callable

from torchdoctor.checkpoint.evidence import MAX_LISTED, CheckpointEvidence, short
from torchdoctor.checkpoint.walk import iter_tensors

# a key rewrite that only strips a wrapper: the keys fit --model after it (ckpt-wrapper-prefix says it)
PREFIX_ONLY_REWRITES = ("strip 'module.'", "strip '_orig_mod.'", "remove")
WRAPPERS = {"_orig_mod.": "torch.compile", "_fsdp_wrapped_module.": "FSDP (v1)",
            "_checkpoint_wrapped_module.": "activation checkpoint wrapper"}


def mode_of(ev: CheckpointEvidence) -> str:
    """resume | weights | part: what the checkpoint must hold.

    Under ``auto`` a file that is one part of a multi-file checkpoint is a ``part``; one that
    carries any training state (optimizer, scheduler, scaler, RNG) or a progress counter or a
    training config (nanoGPT's ``iter_num``/``config``, the DDP tutorial's ``EPOCHS_RUN``) is a
    training snapshot; only bare weights are an export.
    """
    if ev.part and ev.expect == "auto":
        return "part"
    if ev.expect in ("resume", "weights"):
        return ev.expect
    r = ev.roles
    return "resume" if (r.optimizers or r.schedulers or r.scalers or r.rng or r.progress or r.config) \
        else "weights"


def derive(ev: CheckpointEvidence, guard: Callable[[str, Callable], object]) -> CheckpointEvidence:
    """Fill the derived fields of ``ev``; ``guard(name, fn)`` runs one derivation (None on a crash)."""
    from torchdoctor.checkpoint.parts import part_of

    try:
        ev.part = part_of(ev)
    except Exception:  # noqa: BLE001 - odd input: judged as a whole file
        ev.part = None
    ev.mode = mode_of(ev)
    steps = (("pickle globals", _globals), ("training state", _training_state), ("non-finite split", _nonfinite),
             ("model fit", _model_fit), ("wrapper prefixes", _wrappers), ("optimizer fit", _optimizer_fit))
    for name, fn in steps:  # each assigns its fields only once computed: a crash leaves them empty
        if guard(f"derive {name}", lambda fn=fn: fn(ev) or True) is None:
            ev.derive_failed[name] = f"deriving the {name} failed (see internal-error)"
    ev.facts = guard("derive facts", lambda: facts(ev)) or {}
    return ev


def _globals(ev: CheckpointEvidence) -> None:
    from torchdoctor.checkpoint.pickle_globals import classify

    if ev.contents.pickles:
        ev.globals = classify(ev)


def _training_state(ev: CheckpointEvidence) -> None:
    r = ev.roles
    cuda = sorted({t.device for _n, t in iter_tensors(ev.tree) if t.device.startswith("cuda")})
    if r.rng:
        ev.rng_missing = [name for name, absent in (("torch CPU", "torch" not in r.rng),
                                                     ("CUDA", bool(cuda) and "cuda" not in r.rng))
                          if absent]
    ev.cuda_devices = cuda


def weight_role(name: str, ev: CheckpointEvidence) -> str | None:
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


def _nonfinite(ev: CheckpointEvidence) -> None:
    """Weights/optimizer tensors with NaN/Inf; −Inf-only masks and bookkeeping sentinels go to the facts."""
    s = ev.scan
    if s is None or s.skipped_reason:
        return
    masks = [h for h in s.hits if h.nan == 0 and h.posinf == 0 and "mask" in h.name.lower()]
    roles = {id(h): weight_role(h.name, ev) for h in s.hits}
    weights = [(h, roles[id(h)]) for h in s.hits if h not in masks and roles[id(h)] is not None]
    # reported as a fact, not a finding: e.g. best_model_score = inf before the first validation
    other = [describe_hit(h) for h in [h for h in s.hits if h not in masks and roles[id(h)] is None][:MAX_LISTED]]
    ev.nonfinite, ev.neg_inf_masks, ev.nonfinite_bookkeeping = weights, [h.name for h in masks[:MAX_LISTED]], other


def describe_hit(h) -> str:
    return f"{h.name} {h.dtype}{list(h.shape)}: " + ", ".join(
        f"{n} {w}" for n, w in ((h.nan, "NaN"), (h.posinf, "+Inf"), (h.neginf, "-Inf")) if n)


def _model_fit(ev: CheckpointEvidence) -> None:
    from torchdoctor.checkpoint.compare import compare_state

    spec, m = ev.model_spec, ev.roles.model
    if spec is None or m is None or not m.tensors:
        return
    ck = {k: (tuple(t.shape), t.dtype) for k, t in m.tensors.items()}
    res = ev.model_fit = compare_state(ck, spec.state)
    prefix_only = res.transform is not None and not res.missing and not res.unexpected and not res.shape
    if prefix_only and res.transform.startswith(PREFIX_ONLY_REWRITES):
        ev.prefix_only_fit = res.transform


def _wrappers(ev: CheckpointEvidence) -> None:
    from torchdoctor.checkpoint.compare import WRAPPER_SEGMENTS

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
            found.append((seg, n, WRAPPERS[seg]))
    ev.wrappers = found


def _float_params(m_tensors: dict) -> tuple[list[tuple[str, tuple]], int]:
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


def _optimizer_fit(ev: CheckpointEvidence) -> None:
    """Each optimizer state against the --model parameters, or else the checkpoint's own float tensors."""
    from torchdoctor.checkpoint.compare import compare_optimizer

    r, spec = ev.roles, ev.model_spec
    if not r.optimizers:
        return
    if spec is not None:
        params = [(n, s) for n, s, _g in spec.params]
        exact, n_params = True, len(params)
    elif r.model is not None and r.model.tensors:
        params, n_params = _float_params(r.model.tensors)
        exact = False
    else:
        return
    fit = []
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
        fit.append((opt, res))
    ev.optimizer_fit = fit


def facts(ev: CheckpointEvidence) -> dict:
    """``metrics.checkpoint.facts``: side facts of the derivation, in the report's order."""
    out: dict = {}
    r = ev.roles
    if ev.part:
        out["part"] = ev.part
    if ev.globals is not None and ev.globals.module_cls:  # ckpt-full-model-pickle's evidence
        out["module_classes"] = short(sorted(ev.globals.module_cls))
    if ev.mode == "resume":
        if not r.schedulers and r.optimizers and not any(o.has_initial_lr for o in r.optimizers):
            out["scheduler"] = "none attached (no initial_lr in param_groups)"
        if r.rng:
            out["rng"] = {"found": r.rng, "missing": ev.rng_missing}
    if ev.neg_inf_masks:
        out["intentional_neg_inf"] = ev.neg_inf_masks
    if ev.nonfinite_bookkeeping:
        out["nonfinite_bookkeeping"] = ev.nonfinite_bookkeeping
    if ev.model_fit is not None:
        res, spec = ev.model_fit, ev.model_spec
        out["model_compare"] = {
            "model": spec.source, "model_keys": len(spec.state), "checkpoint_keys": len(ev.roles.model.tensors),
            "matched": res.matched, "missing": len(res.missing), "unexpected": len(res.unexpected),
            "shape_mismatches": len(res.shape),
            "dtype_differences": [f"{k}: {a} → {b}" for k, a, b in res.dtype[:MAX_LISTED]],
            "key_rewrite": res.transform,
        }
    if ev.prefix_only_fit:
        out["model_keys_fit_after_prefix"] = ev.prefix_only_fit
    if ev.wrappers:
        out["wrapper_prefixes"] = [p for p, _n, _w in ev.wrappers]
    notes = [n for _o, res in ev.optimizer_fit for n in res.notes]
    if notes:
        out["optimizer_notes"] = notes
    if ev.optimizer_fit:
        out["optimizer_vs_params"] = [{"optimizer": o.path or "<root>", "params_in_groups": res.n_ids,
                                       "model_params": res.n_params,
                                       "against": "--model" if ev.model_spec else "checkpoint"}
                                      for o, res in ev.optimizer_fit]
    return out
