"""Judgment: evidence of a read checkpoint → findings (pure functions, no I/O, no torch).

``judge`` runs every rule on an :class:`Evidence`; each rule returns findings and may
mark itself skipped with a reason ("not applicable" is not "healthy").

What is expected of a checkpoint depends on what it is for (``--expect``):
``resume`` requires everything needed to continue training exactly (optimizer,
scheduler when one drives the LR, RNG, progress counter, GradScaler under float16);
``weights`` requires only sound weights; ``auto`` (default) treats a checkpoint that
holds any optimizer/scheduler/scaler/RNG state as a training checkpoint and any other as
a weights export, which gets one info finding instead of a warning per missing part.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from torchdoctor.checkpoint.allowlist import BLOCKED_MODULES, is_numpy_array_global, is_weights_only_global
from torchdoctor.checkpoint.compare import (
    WRAPPER_SEGMENTS,
    ModelSpec,
    compare_optimizer,
    compare_state,
)
from torchdoctor.checkpoint.dcp import DCP_EXPECTED_PREFIXES
from torchdoctor.checkpoint.roles import Roles
from torchdoctor.checkpoint.scan import ScanResult
from torchdoctor.checkpoint.values import Contents, Opaque, TensorInfo
from torchdoctor.checkpoint.walk import iter_nodes, iter_tensors
from torchdoctor.findings import Finding, finding

DANGEROUS_MODULES = frozenset(BLOCKED_MODULES | {
    "subprocess", "shutil", "socket", "runpy", "importlib", "pickle", "_pickle", "marshal", "ctypes",
    "webbrowser", "pty", "code", "codeop", "multiprocessing", "asyncio", "http", "urllib", "requests",
    "pdb", "bdb", "timeit", "cProfile", "profile", "commands", "platform",
})
DANGEROUS_BUILTINS = frozenset({"eval", "exec", "compile", "open", "__import__", "getattr", "setattr",
                                "delattr", "globals", "locals", "vars", "input", "breakpoint", "apply",
                                "execfile", "memoryview"})
MAX_LIST = 12


@dataclass
class Evidence:
    contents: Contents
    roles: Roles
    scan: ScanResult | None = None
    scan_skip: str | None = None
    expect: str = "auto"  # auto | resume | weights
    model_spec: ModelSpec | None = None
    stub_root: Any = None  # the tree read without unpickling (devices, calls), even after --unsafe-load


@dataclass
class Judgment:
    findings: list[Finding] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mode: str = "weights"  # the expectation applied: resume | weights
    facts: dict = field(default_factory=dict)  # measured side facts for metrics


def judge(ev: Evidence) -> Judgment:
    j = Judgment()
    j.mode = _mode(ev)
    for rule in RULES:
        rule(ev, j)
    return j


def _mode(ev: Evidence) -> str:
    if ev.expect in ("resume", "weights"):
        return ev.expect
    r = ev.roles
    return "resume" if (r.optimizers or r.schedulers or r.scalers or r.rng) else "weights"


def _short(items: list, n: int = MAX_LIST) -> list:
    return list(items[:n]) + ([f"… (+{len(items) - n})"] if len(items) > n else [])


# -- problems while reading -------------------------------------------------------------

def rule_unreadable_parts(ev: Evidence, j: Judgment) -> None:
    probs = ev.contents.problems
    if not probs:
        return
    whats = [f"{p['what']}: {p['reason']}" for p in probs]
    j.findings.append(finding(
        "ckpt-unreadable",
        f"{len(probs)} part{'s' if len(probs) != 1 else ''} of the checkpoint could not be read: {whats[0]}",
        {"path": ev.contents.path, "format": ev.contents.format, "parts": _short(whats)},
        fix="Re-copy or re-save the checkpoint; a missing shard or data file means the copy or the save was "
            "incomplete (compare file sizes with the source).",
    ))


# -- safety ---------------------------------------------------------------------------

def _dangerous(name: str) -> bool:
    mod = name.split(".", 1)[0]
    if mod in DANGEROUS_MODULES or name.startswith("<"):
        return True
    return mod == "builtins" and name.split(".", 1)[1] in DANGEROUS_BUILTINS


def _calls(root: Any, names: set[str]) -> list[str]:
    """What the pickle would have called, as recorded by the stub unpickler (never run)."""
    out = []
    for _path, v, _d in iter_nodes(root, max_depth=12):
        if isinstance(v, Opaque) and v.cls.split("(", 1)[0] in names and v.args:
            args = ", ".join(repr(a)[:120] for a in v.args[:3])
            out.append(f"{v.cls}({args})")
        if len(out) >= 5:
            break
    return out


AUX_PICKLES = ("training_args.bin",)  # Hugging Face Trainer config: pickled by design, never loaded to resume


def rule_unsafe_pickle(ev: Evidence, j: Judgment) -> None:
    c = ev.contents
    if not c.pickles:
        j.skipped.append(("ckpt-unsafe-pickle", f"{c.format}: no pickle in this format"))
        return
    unsafe: dict[str, list[str]] = {}
    numpy_only: dict[str, list[str]] = {}
    aux: dict[str, list[str]] = {}
    ops: dict[str, list[str]] = {}
    module_records = []
    for p in c.pickles:
        dcp = c.format == "dcp"
        is_aux = any(a in p.name for a in AUX_PICKLES)
        for g in p.globals:
            if is_weights_only_global(g) or (dcp and g.startswith(DCP_EXPECTED_PREFIXES)):
                continue
            target = numpy_only if is_numpy_array_global(g) else aux if is_aux else unsafe
            target.setdefault(g, []).append(p.name)
        if p.unsupported_ops and not dcp and not is_aux:
            ops[p.name] = p.unsupported_ops
        if "module" in p.persistent_kinds:
            module_records.append(p.name)
    if unsafe or ops or module_records:
        _unsafe_finding(ev, j, unsafe, ops, module_records, numpy_only)
    elif numpy_only or aux:
        ev_: dict[str, Any] = {}
        parts = []
        if numpy_only:
            ev_["numpy_globals"] = list(numpy_only)
            parts.append("numpy's array globals (a pickled numpy array, e.g. np.random.get_state())")
        if aux:
            ev_["config_pickles"] = sorted({w for ws in aux.values() for w in ws})
            ev_["config_globals"] = _short(list(aux))
            parts.append("the classes of training_args.bin (a pickled config that Trainer never loads to resume)")
        ev_["pickles"] = _short(sorted({w for ws in list(numpy_only.values()) + list(aux.values()) for w in ws}), 4)
        j.findings.append(finding(
            "ckpt-unsafe-pickle",
            "loads with weights_only=True only after allowlisting " + " and ".join(parts),
            ev_,
            fix="For the numpy RNG state: load inside `with torch.serialization.safe_globals([np._core.multiarray."
                "_reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]):`, or save it as tensors/lists "
                "(torch.from_numpy(state[1])) so no allowlist is needed. Never use weights_only=False for files "
                "from others.",
            severity="info",
        ))


def _unsafe_finding(ev: Evidence, j: Judgment, unsafe: dict, ops: dict, module_records: list,
                    numpy_only: dict) -> None:
    c = ev.contents
    where = sorted({w for ws in unsafe.values() for w in ws} | set(ops) | set(module_records))
    bad = [g for g in unsafe if _dangerous(g)]
    calls = _calls(ev.stub_root if ev.stub_root is not None else c.root, set(bad))
    ev_: dict[str, Any] = {"globals": _short(list(unsafe)) or "none outside the allowlist",
                           "pickles": _short(where, 4)}
    if bad:
        ev_["code_it_would_run"] = calls or _short(bad)
    if ops:
        ev_["unsupported_opcodes"] = sorted({o for v in ops.values() for o in v})
    if numpy_only:
        ev_["numpy_globals"] = list(numpy_only)
    ev_["executed"] = "nothing (read from the opcodes; objects kept as inert stand-ins)"
    if bad:
        title = (f"unpickling this file runs code: it imports {', '.join(bad[:3])}"
                 f"{' …' if len(bad) > 3 else ''} (not executed here)")
        fix = ("Do not load it with weights_only=False or pickle: it would run the call shown. Get the weights "
               "from a trusted source, preferably as safetensors.")
    elif unsafe:
        title = (f"torch.load(weights_only=True) refuses it: {len(unsafe)} global"
                 f"{'s' if len(unsafe) != 1 else ''} outside the allowlist ({', '.join(list(unsafe)[:3])}"
                 f"{' …' if len(unsafe) > 3 else ''})")
        fix = ("Save only tensors and plain containers (e.g. vars(args) instead of an argparse.Namespace, "
               "model.state_dict() instead of the model). For files you trust you can allowlist the classes: "
               "torch.serialization.add_safe_globals([...]); never weights_only=False for files from others.")
    elif module_records:
        title = "torch.load(weights_only=True) refuses it: legacy format with a pickled nn.Module class"
        fix = "Re-save model.state_dict() with a current torch.save."
    else:
        title = (f"torch.load(weights_only=True) refuses it: pickle opcodes it does not support "
                 f"({', '.join(sorted({o for v in ops.values() for o in v})[:4])}); the globals are safe")
        fix = ("Re-save with torch.save defaults (pickle protocol 2); a plain pickle.dump or a custom "
               "pickle_protocol produces opcodes the weights-only unpickler rejects.")
    j.findings.append(finding("ckpt-unsafe-pickle", title, ev_, fix=fix))


def rule_full_model_pickle(ev: Evidence, j: Judgment) -> None:
    mods = ev.roles.full_modules
    if not mods:
        return
    path, cls = mods[0]
    n = len(ev.roles.model.tensors) if ev.roles.model and ev.roles.model.full_pickle_class else 0
    j.findings.append(finding(
        "ckpt-full-model-pickle",
        f"a whole nn.Module ({cls}) is pickled{' at ' + repr(path) if path else ''} instead of its state_dict",
        {"modules": [f"{p or '<root>'}: {c}" for p, c in mods[:MAX_LIST]], "tensors": n},
        fix="Save model.state_dict() and rebuild the model in code before load_state_dict: a pickled module "
            "needs its class importable at the same path, breaks on refactors, and loads only with "
            "weights_only=False.",
    ))


# -- contents -------------------------------------------------------------------------

def rule_missing_model(ev: Evidence, j: Judgment) -> None:
    m = ev.roles.model
    top = [k for k, _v, d in iter_nodes(ev.contents.root, max_depth=1) if d == 1]
    if m is None or not m.tensors:
        found = [f"{p}: {r}" for p, r in ev.roles.role_of.items()]
        j.findings.append(finding(
            "ckpt-missing-model",
            "no model weights found: no state_dict (a mapping of names to tensors) and no pickled module",
            {"top_level_keys": _short(top), "recognised": _short(found) or "nothing"},
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


def rule_missing_training_state(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    codes = ("ckpt-missing-optimizer", "ckpt-missing-scheduler", "ckpt-missing-rng", "ckpt-missing-progress",
             "ckpt-missing-scaler")
    if j.mode == "weights":
        why = "--expect weights" if ev.expect == "weights" else "judged a weights export (--expect resume to require)"
        for code in codes:
            j.skipped.append((code, why))
        if ev.expect == "auto" and r.model is not None and r.model.tensors:
            j.findings.append(finding(
                "ckpt-missing-optimizer",
                "weights-only checkpoint: fine for inference or fine-tuning, but training cannot resume exactly "
                "from it (no optimizer, scheduler, RNG state)",
                {"holds": sorted({v.split(" ")[0] for v in r.role_of.values()}),
                 "mode": "auto → weights (pass --expect resume to require training state)"},
                fix="If this file is meant for resuming, save optimizer.state_dict(), scheduler.state_dict(), "
                    "the RNG states and the epoch/step with the model.",
                severity="info",
            ))
        return
    _missing_optimizer(ev, j)
    _missing_scheduler(ev, j)
    _missing_rng(ev, j)
    _missing_progress(ev, j)
    _missing_scaler(ev, j)


def _missing_optimizer(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.optimizers:
        return
    j.findings.append(finding(
        "ckpt-missing-optimizer",
        "no optimizer state: resuming restarts the optimizer (Adam moments, momentum) from zero",
        {"training_state_present": r.training_state or "none", "mode": _mode_text(ev)},
        fix="Save optimizer.state_dict() with the model and load it with optimizer.load_state_dict() after "
            "building the optimizer over the same parameters.",
    ))


def _missing_scheduler(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.schedulers:
        return
    if not r.optimizers:
        j.findings.append(finding(
            "ckpt-missing-scheduler",
            "no LR-scheduler state, and no optimizer state to tell whether a scheduler was used",
            {"mode": _mode_text(ev)},
            fix="If an LR scheduler drives training, save scheduler.state_dict() too.",
            severity="info",
        ))
        return
    opt = next((o for o in r.optimizers if o.has_initial_lr), None)
    if opt is None:
        j.facts["scheduler"] = "none attached (no initial_lr in param_groups)"
        return
    lrs = [(g.get("initial_lr"), g.get("lr")) for g in opt.param_groups if isinstance(g, dict)]
    j.findings.append(finding(
        "ckpt-missing-scheduler",
        "an LR scheduler drove this optimizer (param_groups carry initial_lr) but its state was not saved: "
        "on resume the schedule restarts from step 0",
        {"optimizer": opt.path or "<root>", "initial_lr_vs_lr": [f"{a} → {b}" for a, b in lrs[:4]]},
        fix="Save scheduler.state_dict() and call scheduler.load_state_dict() after creating the scheduler on "
            "resume (create it before loading, with the same arguments).",
    ))


def _cuda_devices(ev: Evidence) -> list[str]:
    root = ev.stub_root if ev.stub_root is not None else ev.contents.root
    return sorted({t.device for _n, t in iter_tensors(root) if t.device.startswith("cuda")})


def _missing_rng(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if not r.rng:
        j.findings.append(finding(
            "ckpt-missing-rng",
            "no RNG state: after resuming, dropout masks, augmentation and shuffling differ from an "
            "uninterrupted run",
            {"looked_for": "torch CPU (uint8[5056]), CUDA (uint8[16] per device), numpy, python random states",
             "mode": _mode_text(ev)},
            fix="Save torch.get_rng_state(), torch.cuda.get_rng_state_all(), np.random.get_state() and "
                "random.getstate() (and the DataLoader generator's state) and restore them on resume.",
        ))
        return
    missing = []
    cuda = _cuda_devices(ev)
    if "torch" not in r.rng:
        missing.append("torch CPU")
    if cuda and "cuda" not in r.rng:
        missing.append("CUDA")
    j.facts["rng"] = {"found": r.rng, "missing": missing}
    if missing:
        j.findings.append(finding(
            "ckpt-missing-rng",
            f"RNG state is incomplete: {' and '.join(missing)} generator state missing",
            {"found": [f"{k} at {v}" for k, v in r.rng.items()], "missing": missing,
             "cuda_tensors_on": cuda or "none"},
            fix="Add torch.get_rng_state() and, when training on GPU, torch.cuda.get_rng_state_all().",
        ))


def _missing_progress(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.progress:
        return
    alt = []
    for o in r.optimizers:
        for st in list(o.state.values())[:1]:
            if isinstance(st, dict) and "step" in st:
                alt.append(f"{o.path or 'optimizer'}.state[...].step (optimizer steps, not epochs)")
    if r.schedulers:
        alt.append(f"{r.schedulers[0]}.last_epoch (scheduler steps)")
    ev_ = {"looked_for": "epoch, step, global_step, iteration … at the top level or in a progress/state dict",
           "mode": _mode_text(ev)}
    if alt:
        ev_["partial_counters"] = alt
    j.findings.append(finding(
        "ckpt-missing-progress",
        "no epoch/step counter: a resumed run does not know where to continue (epoch, sampler epoch, "
        "logging step)",
        ev_,
        fix="Save {'epoch': epoch, 'global_step': step} (the next epoch/step to run) and restore the loop "
            "and DistributedSampler.set_epoch from it.",
    ))


def _missing_scaler(ev: Evidence, j: Judgment) -> None:
    r = ev.roles
    if r.scalers:
        return
    if not r.fp16_signs:
        j.skipped.append(("ckpt-missing-scaler", "no float16 training signs (config flags or float16 "
                                                 "optimizer state)"))
        return
    ev_ = {"float16_signs": _short(r.fp16_signs, 6)}
    if r.empty_scalers:
        ev_["empty_scaler_entries"] = r.empty_scalers
    j.findings.append(finding(
        "ckpt-missing-scaler",
        "float16 training but no GradScaler state: on resume the loss scale restarts at 65536 and the "
        "first steps overflow or underflow",
        ev_,
        fix="Save scaler.state_dict() and restore it with scaler.load_state_dict() (an empty dict means the "
            "scaler was disabled: GradScaler(enabled=False)).",
    ))


def _mode_text(ev: Evidence) -> str:
    return "--expect resume" if ev.expect == "resume" else "auto → resume (training state present)"


def rule_nonfinite(ev: Evidence, j: Judgment) -> None:
    s = ev.scan
    if s is None or s.skipped_reason:
        j.skipped.append(("ckpt-nonfinite-weights", ev.scan_skip or (s.skipped_reason if s else "scan off")))
        return
    masks = [h for h in s.hits if h.nan == 0 and h.posinf == 0 and "mask" in h.name.lower()]
    hits = [h for h in s.hits if h not in masks]
    if masks:
        j.facts["intentional_neg_inf"] = [h.name for h in masks[:MAX_LIST]]
    if not hits:
        return
    model_keys = set(ev.roles.model.tensors) if ev.roles.model else set()
    prefix = (ev.roles.model.path + ".") if ev.roles.model and ev.roles.model.path else ""
    in_model = [h for h in hits if h.name[len(prefix):] in model_keys or h.name in model_keys]
    first = hits[0]
    desc = [f"{h.name} {h.dtype}{list(h.shape)}: " + ", ".join(
        f"{n} {w}" for n, w in ((h.nan, "NaN"), (h.posinf, "+Inf"), (h.neginf, "-Inf")) if n) for h in hits]
    j.findings.append(finding(
        "ckpt-nonfinite-weights",
        f"NaN/Inf in {len(hits)} saved tensor{'s' if len(hits) != 1 else ''} "
        f"({len(in_model)} model, {len(hits) - len(in_model)} other): first {first.name}",
        {"tensors": _short(desc), "first_bad_index": first.first_index},
        fix="Do not resume from or deploy this checkpoint: go back to the last finite one. Find where training "
            "diverged with `torchdoctor nan SCRIPT`, and check for finiteness before saving.",
    ))


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
        {"devices": {d: f"{v[0]} tensors, {v[1] / 2**20:.1f} MiB" for d, v in sorted(devs.items())}},
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
         "model_parameters": res.n_params, "problems": _short(res.problems, 6)},
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
        ev_["missing_keys"] = _short(res.missing, 8)
    if res.unexpected:
        ev_["unexpected_keys"] = _short(res.unexpected, 8)
    if res.shape:
        ev_["shape_mismatches"] = _short([f"{k}: checkpoint {a} vs model {b}" for k, a, b in res.shape], 8)
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


RULES: list[Callable[[Evidence, Judgment], None]] = [
    rule_unreadable_parts,
    rule_unsafe_pickle,
    rule_full_model_pickle,
    rule_missing_model,
    rule_missing_training_state,
    rule_nonfinite,
    rule_model_mismatch,
    rule_wrapper_prefix,
    rule_optimizer_mismatch,
    rule_device_tensors,
]


def device_summary(root: Any) -> dict[str, int]:
    return dict(Counter(t.device for _n, t in iter_tensors(root)))
