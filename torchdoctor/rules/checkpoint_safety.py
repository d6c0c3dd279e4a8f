"""Checkpoint rules on reading and safety: unreadable parts, unsafe pickles, pickled modules.

Probe ``checkpoint-audit``; the evidence is :class:`torchdoctor.checkpoint.evidence.CheckpointEvidence`.
The pickle globals were classified once when the evidence was built (``checkpoint/pickle_globals.py``):
nothing here reads a file or unpickles anything.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.checkpoint.evidence import MAX_LISTED, short
from torchdoctor.checkpoint.values import Opaque, brief
from torchdoctor.checkpoint.walk import iter_nodes
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import CHECKPOINTING

MAX_PICKLES_LISTED = 4  # pickles named in a ckpt-unsafe-pickle finding
MAX_CALLS_SHOWN = 5  # calls the pickle would make, shown with their first arguments
CALL_SEARCH_DEPTH = 12  # how deep the read tree is searched for those calls

UNREADABLE = declare(
    "ckpt-unreadable", CHECKPOINTING, "error",
    "not a checkpoint torchdoctor can read (truncated, corrupt, wrong format): says which",
    thresholds={"MAX_LISTED": MAX_LISTED})
UNSAFE_PICKLE = declare(
    "ckpt-unsafe-pickle", CHECKPOINTING, "warning",
    "needs arbitrary-code unpickling (weights_only=False): lists the globals it would import; nothing is executed",
    thresholds={"MAX_LISTED": MAX_LISTED, "MAX_PICKLES_LISTED": MAX_PICKLES_LISTED,
                "MAX_CALLS_SHOWN": MAX_CALLS_SHOWN, "CALL_SEARCH_DEPTH": CALL_SEARCH_DEPTH})
FULL_MODEL_PICKLE = declare(
    "ckpt-full-model-pickle", CHECKPOINTING, "warning", "a whole pickled nn.Module instead of a state_dict",
    thresholds={"MAX_LISTED": MAX_LISTED})

PROBES = {"checkpoint-audit"}


@rule("ckpt-unreadable", probes=PROBES, needs={"contents"}, raises=[UNREADABLE])
def unreadable_parts(ev) -> list[Finding]:
    """Parts of a folder or index that could not be read (a whole unreadable file is audit.py's report)."""
    probs = ev.contents.problems
    if not probs:
        return []
    whats = [f"{p['what']}: {p['reason']}" for p in probs]
    return [finding(
        "ckpt-unreadable",
        f"{len(probs)} part{'s' if len(probs) != 1 else ''} of the checkpoint could not be read: {whats[0]}",
        {"path": ev.contents.path, "format": ev.contents.format, "parts": short(whats)},
        fix="Re-copy or re-save the checkpoint; a missing shard or data file means the copy or the save was "
            "incomplete (compare file sizes with the source).",
    )]


# -- safety ---------------------------------------------------------------------------

def _calls(root: Any, names: set[str]) -> list[str]:
    """What the pickle would have called, as recorded by the stub unpickler (never run)."""
    out = []
    for _path, v, _d in iter_nodes(root, max_depth=CALL_SEARCH_DEPTH):
        if isinstance(v, Opaque) and v.cls.split("(", 1)[0] in names and v.args:
            args = ", ".join(brief(a, 120) for a in v.args[:3])
            out.append(f"{v.cls}({args})")
        if len(out) >= MAX_CALLS_SHOWN:
            break
    return out


@rule("ckpt-unsafe-pickle", probes=PROBES, needs={"contents", "globals"}, raises=[UNSAFE_PICKLE])
def unsafe_pickle(ev) -> list[Finding]:
    c = ev.contents
    if not c.pickles:
        raise NotApplicable(f"{c.format}: no pickle in this format")
    g = ev.globals
    if g is None:
        raise NotApplicable(ev.derive_failed.get("pickle globals", "the pickle globals were not classified"))
    if g.bad:
        return [_code_finding(ev, g)]
    if g.unsafe or g.ops or g.module_records:
        return [_unsafe_finding(g)]
    if g.numpy_user:
        return [_numpy_finding(g)]
    if g.numpy_fw or g.aux or g.inert or g.dtensor:
        return [_info_finding(g)]
    return []


def _code_finding(ev, g) -> Finding:
    bad = list(g.bad)
    others = {**g.unsafe, **g.numpy_user, **g.numpy_fw, **g.inert, **g.aux}
    calls = _calls(ev.tree, set(bad))
    ev_: dict[str, Any] = {"code_running_globals": short(bad), "code_it_would_run": calls or short(bad)}
    if others:
        ev_["other_globals"] = short(list(others))
    ev_["pickles"] = short(g.where(g.bad), MAX_PICKLES_LISTED)
    if g.stopped:
        ev_["scan_stopped_early"] = short(g.stopped, MAX_PICKLES_LISTED)
        ev_["note"] = "the stream is broken after these globals, but pickle.load imports and calls them first"
    ev_["executed"] = "nothing (read from the opcodes; objects kept as inert stand-ins)"
    return finding(
        "ckpt-unsafe-pickle",
        f"loading this file runs code: it imports {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''} "
        "(torch.load(weights_only=False) or pickle.load would call it; nothing was executed here)",
        ev_,
        fix="Do not load it with weights_only=False, pickle.load or --unsafe-load: it would run the call shown, "
            "with your permissions. Delete it or quarantine it, and get the weights from a trusted source, "
            "preferably as safetensors.",
        severity="error",
    )


def _unsafe_finding(g) -> Finding:
    unsafe, ops = g.unsafe, g.ops
    extra = {**g.numpy_user, **g.numpy_fw, **g.inert, **g.dtensor}
    ev_: dict[str, Any] = {"globals": short(list(unsafe) + list(extra)) or "none outside the allowlist",
                           "pickles": short(sorted(set(g.where(unsafe, extra)) | set(ops) | set(g.module_records)),
                                            MAX_PICKLES_LISTED)}
    if ops:
        ev_["unsupported_opcodes"] = sorted({o for v in ops.values() for o in v})
    if g.stopped:
        ev_["scan_stopped_early"] = short(g.stopped, MAX_PICKLES_LISTED)
    if g.module_cls:
        ev_["module_classes"] = "reported by ckpt-full-model-pickle"
    ev_["executed"] = "nothing (read from the opcodes; objects kept as inert stand-ins)"
    if unsafe:
        title = (f"torch.load(weights_only=True) refuses it: {len(unsafe)} global"
                 f"{'s' if len(unsafe) != 1 else ''} outside the allowlist ({', '.join(list(unsafe)[:3])}"
                 f"{' …' if len(unsafe) > 3 else ''})")
        fix = ("Save only tensors and plain containers (e.g. vars(args) instead of an argparse.Namespace, "
               "model.state_dict() instead of the model). For files you trust you can allowlist the classes: "
               "torch.serialization.add_safe_globals([...]); never weights_only=False for files from others.")
    elif g.module_records:
        title = "torch.load(weights_only=True) refuses it: legacy format with a pickled nn.Module class"
        fix = "Re-save model.state_dict() with a current torch.save."
    else:
        title = (f"torch.load(weights_only=True) refuses it: pickle opcodes it does not support "
                 f"({', '.join(sorted({o for v in ops.values() for o in v})[:4])}); the globals are safe")
        fix = ("Re-save with torch.save defaults (pickle protocol 2); a plain pickle.dump or a custom "
               "pickle_protocol produces opcodes the weights-only unpickler rejects.")
    return finding("ckpt-unsafe-pickle", title, ev_, fix=fix)


NUMPY_FIX = ("Load it inside `with torch.serialization.safe_globals([np._core.multiarray._reconstruct, np.ndarray, "
             "np.dtype, np.dtypes.UInt32DType]):` (all four are needed; the last one is not listed by "
             "get_unsafe_globals_in_checkpoint), or save the state as plain values (torch.from_numpy(state[1]) and "
             "the other fields) so no allowlist is needed. Never weights_only=False for files from others.")


def _numpy_finding(g) -> Finding:
    ev_: dict[str, Any] = {"numpy_globals": list(g.numpy_user),
                           "pickles": short(g.where(g.numpy_user), MAX_PICKLES_LISTED),
                           "also_needed": "numpy.dtypes.UInt32DType (asked for while the array is rebuilt)"}
    if g.inert:
        ev_["config_globals"] = list(g.inert)
    return finding(
        "ckpt-unsafe-pickle",
        "torch.load(path) with its default weights_only=True (torch ≥ 2.6) refuses it: a pickled numpy array "
        "(e.g. np.random.get_state()) needs numpy's globals allowlisted, so a plain resume fails with "
        "UnpicklingError",
        ev_, fix=NUMPY_FIX, severity="warning",
    )


def _info_finding(g) -> Finding:
    ev_: dict[str, Any] = {}
    parts = []
    if g.numpy_fw:
        ev_["numpy_globals"] = list(g.numpy_fw)
        parts.append("numpy's array globals in the framework's RNG file (Hugging Face Trainer and accelerate "
                     "allowlist them when they resume)")
    if g.inert:
        ev_["config_globals"] = list(g.inert)
        parts.append(f"{', '.join(g.inert)} (a pickled config object: an inert class)")
    if g.aux:
        ev_["config_pickles"] = g.where(g.aux)
        ev_["config_globals"] = short(list(g.aux) + list(g.inert))
        parts.append("the classes of training_args.bin (a pickled config that Trainer never loads to resume)")
    dt_title = ""
    if g.dtensor:
        ev_["dtensor_globals"] = short(list(g.dtensor))
        dt_title = ("loads with weights_only=True once torch.distributed.tensor is imported, which "
                    "allowlists the DTensor classes of this sharded state (an FSDP2 / tensor-parallel "
                    "script imports it; a bare torch.load in a fresh process refuses them)")
    ev_["pickles"] = short(g.where(g.numpy_fw, g.inert, g.aux, g.dtensor), MAX_PICKLES_LISTED)
    fix = ("Nothing here runs code. To load with the default torch.load, allowlist the classes for files you trust: "
           "torch.serialization.add_safe_globals([argparse.Namespace]) (or save vars(args), a plain dict). "
           if g.inert else "")
    if g.numpy_fw:
        fix += NUMPY_FIX
    if g.aux and not fix:
        fix = "Nothing to do for resuming with the Trainer; never load training_args.bin from others with pickle."
    if g.dtensor and not fix:
        fix = ("Nothing to do when the resuming script builds the sharded model first (it imports "
               "torch.distributed.tensor); to read the file alone, `import torch.distributed.tensor` before "
               "torch.load. A per-rank torch.save only reloads on the same world size and mesh: "
               "torch.distributed.checkpoint (dcp.save of get_state_dict) re-shards on load.")
    title = "; ".join(([("loads with weights_only=True only after allowlisting " + " and ".join(parts))]
                       if parts else []) + ([dt_title] if dt_title else []))
    return finding("ckpt-unsafe-pickle", title, ev_, fix=fix, severity="info")


@rule("ckpt-full-model-pickle", probes=PROBES, needs={"roles", "globals"}, raises=[FULL_MODEL_PICKLE])
def full_model_pickle(ev) -> list[Finding]:
    mods = ev.roles.full_modules
    if not mods:
        return []
    path, cls = mods[0]
    n = len(ev.roles.model.tensors) if ev.roles.model and ev.roles.model.full_pickle_class else 0
    ev_: dict[str, Any] = {"modules": [f"{p or '<root>'}: {c}" for p, c in mods[:MAX_LISTED]], "tensors": n}
    classes = ev.facts.get("module_classes")
    if classes:
        ev_["classes_outside_allowlist"] = classes
    return [finding(
        "ckpt-full-model-pickle",
        f"a whole nn.Module ({cls}) is pickled{' at ' + repr(path) if path else ''} instead of its state_dict: "
        "torch.load(path) with its default weights_only=True (torch ≥ 2.6) refuses it",
        ev_,
        fix="Save model.state_dict() instead, and rebuild the model in code before model.load_state_dict("
            "torch.load(path)): a pickled module loads only with weights_only=False (which runs whatever the file "
            "imports), needs its class importable at the same module path, and breaks on refactors. To convert "
            "a file you made: torch.save(torch.load(path, weights_only=False).state_dict(), new_path).",
    )]
