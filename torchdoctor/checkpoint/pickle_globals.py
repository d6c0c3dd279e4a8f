"""The globals a checkpoint's pickles would import, sorted by what loading them means.

A derivation step of the audit (``derive.py``), read by the ``ckpt-unsafe-pickle`` and
``ckpt-full-model-pickle`` rules: which globals run code on ``pickle.load`` (``DANGEROUS_*``),
which ones ``torch.load(weights_only=True)`` refuses, which are numpy arrays in a framework's RNG
file (its loader allowlists them), inert config classes, and a Trainer's ``training_args.bin``.
Nothing here unpickles anything: the globals were read from the opcodes.
"""

from __future__ import annotations

from torchdoctor.checkpoint.allowlist import (BLOCKED_MODULES, is_dtensor_global, is_numpy_array_global,
                                              is_weights_only_global)
from torchdoctor.checkpoint.dcp import DCP_EXPECTED_PREFIXES

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


def module_classes_of(ev) -> set[str]:
    """Classes of the pickled nn.Modules (``ckpt-full-model-pickle``'s evidence), when there are any."""
    if not ev.roles.full_modules:
        return set()
    return {c.split("(", 1)[0] for c in ev.roles.module_classes}


class PickleGlobals:
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
        self.dtensor: dict[str, list[str]] = {}  # DTensor state: allowed once torch.distributed.tensor is imported
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
            elif is_dtensor_global(name):
                target = self.dtensor
            else:
                target = self.unsafe
            target.setdefault(name, []).append(p.name)
        if p.unsupported_ops and not dcp and not is_aux:
            self.ops[p.name] = p.unsupported_ops
        if "module" in p.persistent_kinds and not self.module_classes:  # legacy module source records
            self.module_records.append(p.name)

    def where(self, *groups: dict) -> list[str]:
        return sorted({w for grp in groups for ws in grp.values() for w in ws})


def classify(ev) -> PickleGlobals:
    """The globals of every pickle of the evidence, sorted (see :class:`PickleGlobals`)."""
    g = PickleGlobals(module_classes_of(ev))
    for p in ev.contents.pickles:
        g.add(p, dcp=ev.contents.format == "dcp")
    return g
