"""The file formats of a report behind one interface (issue 31 item 5).

A :class:`Format` renders the report's JSON form (``Report.to_dict()``, or a saved report.json:
the same dict) to the text of one file. ``--json``/``--html``/``--sarif``/``--junit`` all write
through :func:`write`: the file is checked before any work (:func:`check_target`, exit 2 if
unfit), an existing file is replaced only when torchdoctor wrote it (its ``marker`` is in its
first bytes), and the write is atomic (temp file + rename: a symlink is replaced, not followed).

Adding a format is one module with a ``FORMAT = Format(...)`` and one line in :data:`MODULES`.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torchdoctor.errors import DoctorError

MODULES = {"json": "torchdoctor.report.jsonout", "html": "torchdoctor.report.html.output",
           "sarif": "torchdoctor.report.sarif", "junit": "torchdoctor.report.junit"}
HEAD_BYTES = 4096  # where a file's marker must be for us to call it ours


@dataclass(frozen=True)
class Format:
    name: str  # "sarif"
    suffix: str  # ".sarif"
    marker: str  # text in the first HEAD_BYTES of every file of this format we write
    render: Callable[[dict[str, Any]], str]  # the report's dict → the file's text


def get(name: str) -> Format:
    return importlib.import_module(MODULES[name]).FORMAT


def is_ours(path: Path, fmt: Format) -> bool:
    try:
        with open(path, "rb") as f:
            return fmt.marker in f.read(HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return False


def check_target(name: str, path: str | None) -> Path | None:
    """The file ``--NAME PATH`` asks for, checked before any work (DoctorError: exit 2)."""
    if path is None:
        return None
    fmt = get(name)
    p = Path(path)
    if not str(path).strip() or p.is_dir():
        raise DoctorError(f"--{name} {path}: is a folder" if str(path).strip() else f"--{name}: empty path",
                          hint=f"pass a file name: --{name} report{fmt.suffix}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise DoctorError(f"--{name} {p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise DoctorError(f"--{name} {p}: cannot write to {parent}")
    if p.exists() and not is_ours(p, fmt):
        raise DoctorError(f"--{name} {p}: the file exists and was not written by torchdoctor; it is left "
                          f"as it is", hint="pass a new file name")
    return p


def write_text(path: Path, text: str, suffix: str) -> None:
    """Replace ``path`` atomically: a temp file in the same folder, then a rename (the one writer of
    every report file)."""
    import tempfile

    from torchdoctor.safe import OUTPUT_ERRORS

    fd, tmp = tempfile.mkstemp(prefix=".torchdoctor-", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors=OUTPUT_ERRORS) as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write(name: str, path: Path, data: dict[str, Any]) -> None:
    """Render ``data`` (a report's dict) in format ``name`` to ``path``, atomically."""
    text = get(name).render(data)
    write_text(path, text, get(name).suffix)
