"""Rules on reading and safety: unreadable parts, unsafe pickles, pickled modules."""

from __future__ import annotations

from typing import Any

from torchdoctor.checkpoint.allowlist import BLOCKED_MODULES, is_numpy_array_global, is_weights_only_global
from torchdoctor.checkpoint.dcp import DCP_EXPECTED_PREFIXES
from torchdoctor.checkpoint.rules_base import MAX_LIST, Evidence, Judgment, short
from torchdoctor.checkpoint.values import Opaque, brief
from torchdoctor.checkpoint.walk import iter_nodes
from torchdoctor.findings import finding

# Globals through which unpickling runs code (a shell, exec/eval, imports, file or network
# access, a nested unpickler). Any of them makes the file an error: it is not "weights that
# need allowlisting" but a program that runs on torch.load(weights_only=False) / pickle.load.
DANGEROUS_MODULES = frozenset(BLOCKED_MODULES | {
    "subprocess", "_posixsubprocess", "shutil", "socket", "_socket", "ssl", "runpy", "importlib", "pkgutil",
    "zipimport", "pickle", "_pickle", "pickletools", "marshal", "shelve", "dill", "cloudpickle", "joblib",
    "ctypes", "_ctypes", "cffi", "webbrowser", "pty", "tty", "termios", "fcntl", "code", "codeop", "pdb", "bdb",
    "trace", "doctest", "pydoc", "timeit", "cProfile", "profile", "multiprocessing", "concurrent", "threading",
    "_thread", "signal", "asyncio", "selectors", "select", "http", "urllib", "urllib2", "requests", "httpx",
    "ftplib", "smtplib", "telnetlib", "xmlrpc", "socketserver", "commands", "platform", "sysconfig", "site",
    "venv", "ensurepip", "pip", "setuptools", "distutils", "idlelib", "lib2to3", "operator", "_operator",
    "types", "inspect", "gc", "io", "_io", "tempfile", "fileinput", "linecache", "builtins", "__builtin__",
    "mmap", "resource", "_winapi", "msvcrt", "winreg", "_winreg",
})
# builtins that are plain data constructors (the rest of builtins can run code or touch files)
SAFE_BUILTINS = frozenset({"set", "frozenset", "complex", "bytearray", "bytes", "slice", "range", "int", "float",
                           "str", "bool", "list", "tuple", "dict", "object", "Ellipsis", "NotImplemented"})
# outside these modules: names that load or fetch other code
DANGEROUS_NAMES = frozenset({
    "torch.load", "torch.jit.load", "torch.hub.load", "torch.hub.load_state_dict_from_url",
    "torch.hub.download_url_to_file", "torch.package.PackageImporter", "torch.serialization.load",
    "torch._C._jit_get_operation", "numpy.load", "numpy.lib.npyio.load", "numpy.fromfile", "numpy.loadtxt",
    "numpy.testing._private.utils.runstring", "numpy.f2py.compile", "numpy.distutils.exec_command",
})
DANGEROUS_PREFIXES = ("torch.hub.", "torch.package.", "torch.utils.cpp_extension.", "torch.distributed.rpc.",
                      "numpy.testing.", "numpy.f2py.", "numpy.distutils.")
# inert config classes: harmless to build, refused by weights_only only because not allowlisted
INERT_CONFIG = frozenset({"argparse.Namespace", "types.SimpleNamespace"})
AUX_PICKLES = ("training_args.bin",)  # Hugging Face Trainer config: pickled by design, never loaded to resume


def dangerous(name: str) -> bool:
    """True when importing/calling ``name`` during unpickling can run code (see DANGEROUS_*)."""
    if name.startswith("<"):  # a name computed at run time, or a copyreg extension code
        return True
    if name in INERT_CONFIG:
        return False
    mod, _, rest = name.partition(".")
    if mod in ("builtins", "__builtin__"):  # exception classes are inert data too (a pickled error record)
        return rest not in SAFE_BUILTINS and not rest.endswith(("Error", "Exception", "Warning"))
    if mod in DANGEROUS_MODULES:
        return True
    return name in DANGEROUS_NAMES or name.startswith(DANGEROUS_PREFIXES)



def _framework_rng(pickle_name: str) -> bool:
    """RNG files whose own loader allowlists numpy (HF Trainer rng_state*.pth, accelerate random_states_*.pkl)."""
    import os

    base = os.path.basename(pickle_name.split(":", 1)[0])
    return (base.startswith("rng_state") and base.endswith(".pth")) or \
        (base.startswith("random_states_") and base.endswith(".pkl"))


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

def _calls(root: Any, names: set[str]) -> list[str]:
    """What the pickle would have called, as recorded by the stub unpickler (never run)."""
    out = []
    for _path, v, _d in iter_nodes(root, max_depth=12):
        if isinstance(v, Opaque) and v.cls.split("(", 1)[0] in names and v.args:
            args = ", ".join(brief(a, 120) for a in v.args[:3])
            out.append(f"{v.cls}({args})")
        if len(out) >= 5:
            break
    return out


def rule_unsafe_pickle(ev: Evidence, j: Judgment) -> None:
    c = ev.contents
    if not c.pickles:
        j.skipped.append(("ckpt-unsafe-pickle", f"{c.format}: no pickle in this format"))
        return
    g = _Globals(_module_classes(ev))
    for p in c.pickles:
        g.add(p, dcp=c.format == "dcp")
    if g.module_cls:  # the same cause is ckpt-full-model-pickle's evidence: not reported twice
        j.facts["module_classes"] = short(sorted(g.module_cls))
    if g.bad:
        _code_finding(ev, j, g)
    elif g.unsafe or g.ops or g.module_records:
        _unsafe_finding(j, g)
    elif g.numpy_user:
        _numpy_finding(j, g)
    elif g.numpy_fw or g.aux or g.inert:
        _info_finding(j, g)


def _module_classes(ev: Evidence) -> set[str]:
    """Classes of the pickled nn.Modules (``ckpt-full-model-pickle``'s evidence), when there are any."""
    if not ev.roles.full_modules:
        return set()
    return {c.split("(", 1)[0] for c in ev.roles.module_classes}


class _Globals:
    """The non-allowlisted globals of every pickle, sorted by what loading them means.

    With ``module_classes`` (a whole pickled nn.Module is in the file), the module's own classes —
    the user's model classes and torch's ``torch.nn`` classes — are the full-model-pickle finding's
    evidence, not unsafe-pickle's: one cause, one finding. A code-running global is always ``bad``.
    """

    def __init__(self, module_classes: set[str] | frozenset = frozenset()):
        self.module_classes = module_classes
        self.module_cls: set[str] = set()  # globals that are classes of the pickled modules
        self.bad: dict[str, list[str]] = {}  # run code
        self.unsafe: dict[str, list[str]] = {}  # other classes weights_only refuses
        self.numpy_user: dict[str, list[str]] = {}  # numpy arrays in a file a plain torch.load must read
        self.numpy_fw: dict[str, list[str]] = {}  # numpy arrays in HF/accelerate RNG files (their loader allowlists)
        self.inert: dict[str, list[str]] = {}  # argparse.Namespace & co
        self.aux: dict[str, list[str]] = {}  # training_args.bin
        self.ops: dict[str, list[str]] = {}
        self.module_records: list[str] = []
        self.stopped: list[str] = []  # pickles whose scan stopped early (truncated/corrupt)

    def add(self, p, dcp: bool) -> None:
        is_aux = any(a in p.name for a in AUX_PICKLES)
        if p.error:
            self.stopped.append(f"{p.name}: {p.error}")
        for name in p.globals:
            if is_weights_only_global(name) or (dcp and name.startswith(DCP_EXPECTED_PREFIXES)):
                continue
            if dangerous(name):
                target = self.bad
            elif self.module_classes and (name in self.module_classes or name.startswith("torch.nn.")):
                self.module_cls.add(name)
                continue
            elif is_aux:
                target = self.aux
            elif is_numpy_array_global(name):
                target = self.numpy_fw if _framework_rng(p.name) else self.numpy_user
            elif name in INERT_CONFIG:
                target = self.inert
            else:
                target = self.unsafe
            target.setdefault(name, []).append(p.name)
        if p.unsupported_ops and not dcp and not is_aux:
            self.ops[p.name] = p.unsupported_ops
        if "module" in p.persistent_kinds and not self.module_classes:  # legacy module source records
            self.module_records.append(p.name)

    def where(self, *groups: dict) -> list[str]:
        return sorted({w for grp in groups for ws in grp.values() for w in ws})


def _code_finding(ev: Evidence, j: Judgment, g: _Globals) -> None:
    c = ev.contents
    bad = list(g.bad)
    others = {**g.unsafe, **g.numpy_user, **g.numpy_fw, **g.inert, **g.aux}
    calls = _calls(ev.stub_root if ev.stub_root is not None else c.root, set(bad))
    ev_: dict[str, Any] = {"code_running_globals": short(bad), "code_it_would_run": calls or short(bad)}
    if others:
        ev_["other_globals"] = short(list(others))
    ev_["pickles"] = short(g.where(g.bad), 4)
    if g.stopped:
        ev_["scan_stopped_early"] = short(g.stopped, 4)
        ev_["note"] = "the stream is broken after these globals, but pickle.load imports and calls them first"
    ev_["executed"] = "nothing (read from the opcodes; objects kept as inert stand-ins)"
    j.findings.append(finding(
        "ckpt-unsafe-pickle",
        f"loading this file runs code: it imports {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''} "
        "(torch.load(weights_only=False) or pickle.load would call it; nothing was executed here)",
        ev_,
        fix="Do not load it with weights_only=False, pickle.load or --unsafe-load: it would run the call shown, "
            "with your permissions. Delete it or quarantine it, and get the weights from a trusted source, "
            "preferably as safetensors.",
        severity="error",
    ))


def _unsafe_finding(j: Judgment, g: _Globals) -> None:
    unsafe, ops = g.unsafe, g.ops
    extra = {**g.numpy_user, **g.numpy_fw, **g.inert}
    ev_: dict[str, Any] = {"globals": short(list(unsafe) + list(extra)) or "none outside the allowlist",
                           "pickles": short(sorted(set(g.where(unsafe, extra)) | set(ops) | set(g.module_records)), 4)}
    if ops:
        ev_["unsupported_opcodes"] = sorted({o for v in ops.values() for o in v})
    if g.stopped:
        ev_["scan_stopped_early"] = short(g.stopped, 4)
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
    j.findings.append(finding("ckpt-unsafe-pickle", title, ev_, fix=fix))


NUMPY_FIX = ("Load it inside `with torch.serialization.safe_globals([np._core.multiarray._reconstruct, np.ndarray, "
             "np.dtype, np.dtypes.UInt32DType]):` (all four are needed; the last one is not listed by "
             "get_unsafe_globals_in_checkpoint), or save the state as plain values (torch.from_numpy(state[1]) and "
             "the other fields) so no allowlist is needed. Never weights_only=False for files from others.")


def _numpy_finding(j: Judgment, g: _Globals) -> None:
    ev_: dict[str, Any] = {"numpy_globals": list(g.numpy_user), "pickles": short(g.where(g.numpy_user), 4),
                           "also_needed": "numpy.dtypes.UInt32DType (asked for while the array is rebuilt)"}
    if g.inert:
        ev_["config_globals"] = list(g.inert)
    j.findings.append(finding(
        "ckpt-unsafe-pickle",
        "torch.load(path) with its default weights_only=True (torch ≥ 2.6) refuses it: a pickled numpy array "
        "(e.g. np.random.get_state()) needs numpy's globals allowlisted, so a plain resume fails with "
        "UnpicklingError",
        ev_, fix=NUMPY_FIX, severity="warning",
    ))


def _info_finding(j: Judgment, g: _Globals) -> None:
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
    ev_["pickles"] = short(g.where(g.numpy_fw, g.inert, g.aux), 4)
    fix = ("Nothing here runs code. To load with the default torch.load, allowlist the classes for files you trust: "
           "torch.serialization.add_safe_globals([argparse.Namespace]) (or save vars(args), a plain dict). "
           if g.inert else "")
    if g.numpy_fw:
        fix += NUMPY_FIX
    if g.aux and not fix:
        fix = "Nothing to do for resuming with the Trainer; never load training_args.bin from others with pickle."
    j.findings.append(finding(
        "ckpt-unsafe-pickle",
        "loads with weights_only=True only after allowlisting " + " and ".join(parts),
        ev_, fix=fix, severity="info",
    ))


def rule_full_model_pickle(ev: Evidence, j: Judgment) -> None:
    mods = ev.roles.full_modules
    if not mods:
        return
    path, cls = mods[0]
    n = len(ev.roles.model.tensors) if ev.roles.model and ev.roles.model.full_pickle_class else 0
    ev_: dict[str, Any] = {"modules": [f"{p or '<root>'}: {c}" for p, c in mods[:MAX_LIST]], "tensors": n}
    classes = j.facts.get("module_classes")
    if classes:
        ev_["classes_outside_allowlist"] = classes
    j.findings.append(finding(
        "ckpt-full-model-pickle",
        f"a whole nn.Module ({cls}) is pickled{' at ' + repr(path) if path else ''} instead of its state_dict: "
        "torch.load(path) with its default weights_only=True (torch ≥ 2.6) refuses it",
        ev_,
        fix="Save model.state_dict() instead, and rebuild the model in code before model.load_state_dict("
            "torch.load(path)): a pickled module loads only with weights_only=False (which runs whatever the file "
            "imports), needs its class importable at the same module path, and breaks on refactors. To convert "
            "a file you made: torch.save(torch.load(path, weights_only=False).state_dict(), new_path).",
    ))


# -- contents -------------------------------------------------------------------------
