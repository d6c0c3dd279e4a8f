"""torchdoctor: a command-line doctor for PyTorch training.

Diagnosis before solutions: route the symptom, measure the run, report findings.
Nothing heavy is imported here: `torchdoctor --help` and `ask` must stay fast.
"""

from torchdoctor.version import __version__  # noqa: F401

# The Python API (torchdoctor/api.py), resolved on first use so that `import torchdoctor` imports
# nothing more: torchdoctor.checkup("train.py", steps=50) runs the probe in a child process. The
# probes whose names are also subpackages here (memory, treat, gradcheck, compare) are in
# torchdoctor.api only: an import of the subpackage would replace the function on this module.
_API = ("checkup", "profile", "nan", "compile", "repro", "checkpoint_audit", "env", "demo", "run",
        "RunReport", "TorchdoctorError")


def __getattr__(name: str):
    if name in _API:
        from torchdoctor import api

        return getattr(api, name)
    raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])
