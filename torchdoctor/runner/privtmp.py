"""A private TMPDIR for each run: what torch and the script leave in the temp folder goes with it.

torch's own temporaries outlive a run that is stopped, killed or simply ends without cleaning up:
DataLoader workers' ``pymp-*`` folders, inductor's ``torchinductor_<user>`` cache and its C++
compiler's ``cc*.s`` files, torchrun's ``torchelastic_*`` logs. A plain run of the script leaves
them too, but torchdoctor runs a script many times (``repro``, ``treat``, follow-ups), so they
pile up in the user's temp folder. Each run therefore gets ``TMPDIR`` set to a fresh folder of
its own, ``tmp`` under the run directory, removed when every process of the run is gone.

Unix sockets live in TMPDIR too (``multiprocessing``'s listeners: ``pymp-XXXX/listener-XXXX``),
and their path is limited to 107 bytes: where the run directory is deep (``--out`` far down a
tree) the private folder is made in the parent's temp folder instead (``torchdoctor-tmp-*``).
``TORCHDOCTOR_KEEP_RUN`` keeps it, as it keeps the run directory. Never imports torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

ENV = "TMPDIR"  # tempfile, multiprocessing, gcc and torch all read it first
MAX_PATH = 64  # leaves room for "/pymp-XXXXXXXX/listener-XXXXXXXX" under the 107-byte socket path


def make(run_dir: str | os.PathLike) -> Path:
    """A fresh, empty, private (0700) temp folder for the run in ``run_dir``."""
    p = Path(run_dir).resolve() / "tmp"
    if len(os.fsencode(str(p))) <= MAX_PATH:
        if os.path.lexists(p):
            remove(p)
        p.mkdir(mode=0o700)
        return p
    return Path(tempfile.mkdtemp(prefix="torchdoctor-tmp-"))


def remove(path: str | os.PathLike) -> None:
    """Remove the run's temp folder (after every process of the run is gone); never raises."""
    if os.environ.get("TORCHDOCTOR_KEEP_RUN"):
        return
    p = Path(path)
    try:
        if p.is_symlink():
            p.unlink()
            return
    except OSError:
        return

    def writable(func, name, _exc):  # a read-only folder the script made: make it removable, retry once
        try:
            os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            func(name)
        except OSError:
            pass

    shutil.rmtree(p, onerror=writable)
