"""Rules on reading and safety: unreadable parts, unsafe pickles, pickled modules."""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.allowlist import BLOCKED_MODULES, is_numpy_array_global, is_weights_only_global
from torchdoctor.checkpoint.dcp import DCP_EXPECTED_PREFIXES
from torchdoctor.checkpoint.rules_base import MAX_LIST, Evidence, Judgment, short
from torchdoctor.checkpoint.values import Opaque
from torchdoctor.checkpoint.walk import iter_nodes
from torchdoctor.findings import finding

DANGEROUS_MODULES = frozenset(BLOCKED_MODULES | {
    "subprocess", "shutil", "socket", "runpy", "importlib", "pickle", "_pickle", "marshal", "ctypes",
    "webbrowser", "pty", "code", "codeop", "multiprocessing", "asyncio", "http", "urllib", "requests",
    "pdb", "bdb", "timeit", "cProfile", "profile", "commands", "platform",
})
DANGEROUS_BUILTINS = frozenset({"eval", "exec", "compile", "open", "__import__", "getattr", "setattr",
                                "delattr", "globals", "locals", "vars", "input", "breakpoint", "apply",
                                "execfile", "memoryview"})


def rule_unreadable_parts(ev: Evidence, j: Judgment) -> None:
    probs = ev.contents.problems
    if not probs:
        return
    whats = [f"{p['what']}: {p['reason']}" for p in probs]
    j.findings.append(finding(
        "ckpt-unreadable",
        f"{len(probs)} part{'s' if len(probs) != 1 else ''} of the checkpoint could not be read: {whats[0]}",
        {"path": ev.contents.path, "format": ev.contents.format, "parts": short(whats)},
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
            ev_["config_globals"] = short(list(aux))
            parts.append("the classes of training_args.bin (a pickled config that Trainer never loads to resume)")
        ev_["pickles"] = short(sorted({w for ws in list(numpy_only.values()) + list(aux.values()) for w in ws}), 4)
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
    ev_: dict[str, Any] = {"globals": short(list(unsafe)) or "none outside the allowlist",
                           "pickles": short(where, 4)}
    if bad:
        ev_["code_it_would_run"] = calls or short(bad)
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
