"""``--out DIR``: a folder torchdoctor owns, one run at a time, never a user's file touched.

* :func:`claim` (before any work; bad ``--out`` is exit 2, not a lost run): ``DIR`` must be
  new, empty, or a folder torchdoctor made before (it holds the marker file ``.torchdoctor``);
  a file, an unwritable place or a folder with other content is refused with one line. The
  marker is locked (``flock``) for the whole command: a second run on the same ``DIR`` is
  refused instead of mixing its evidence into the first one's.
* Inside an owned folder, :func:`fresh_subdir` replaces torchdoctor's own sub-folders
  (``run``, ``followup-N``, ``dist-selftest``) and :func:`write_file` replaces its own files
  (``report.json``, ``report.txt``) without following links: a symlink there is removed, never
  written through (``O_CREAT | O_EXCL | O_NOFOLLOW``).

Never imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from torchdoctor.errors import DoctorError

MARKER = ".torchdoctor"
_HELD: dict[str, int] = {}  # resolved DIR -> fd of its locked marker


def claim(out: str | os.PathLike) -> Path:
    """Validate, create and lock ``out``; returns it resolved. DoctorError (exit 2) if unfit."""
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise DoctorError(f"--out {out} is a file, not a folder",
                          hint="pass a new or empty folder for the report and artifacts")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DoctorError(f"--out {out}: cannot create the folder ({e.strerror or e})",
                          hint="pass a folder you can write to") from None
    d = d.resolve()
    key = str(d)
    if key in _HELD:
        return d
    marker = d / MARKER
    try:
        names = [n for n in os.listdir(d) if n != MARKER]
    except OSError as e:
        raise DoctorError(f"--out {out}: cannot read the folder ({e.strerror or e})") from None
    owned = marker.is_file() and not marker.is_symlink()
    if not owned and names:
        raise DoctorError(f"--out {out} is not empty and was not made by torchdoctor; its files "
                          f"are left alone", hint="pass a new or empty folder for --out")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(marker, flags, 0o644)
    except OSError as e:
        raise DoctorError(f"--out {out}: cannot write there ({e.strerror or e})",
                          hint="pass a folder you can write to") from None
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # not POSIX: no lock
        pass
    except OSError:
        holder = _read_holder(fd)
        os.close(fd)
        raise DoctorError(f"--out {out} is in use by another torchdoctor run"
                          f"{f' (pid {holder})' if holder else ''}",
                          hint="wait for it, or pass another folder for --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"tool": "torchdoctor", "pid": os.getpid()}).encode() + b"\n")
    _HELD[key] = fd
    return d


def _read_holder(fd: int) -> int | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return int(json.loads(os.read(fd, 4096) or b"{}").get("pid"))
    except (OSError, ValueError, TypeError):
        return None


def release_all() -> None:
    """Unlock every claimed folder (end of a command)."""
    for key in list(_HELD):
        try:
            os.close(_HELD.pop(key))
        except OSError:
            pass


def owned(d: str | os.PathLike) -> bool:
    m = Path(d) / MARKER
    return m.is_file() and not m.is_symlink()


def _remove(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def fresh_subdir(parent: str | os.PathLike, name: str) -> Path:
    """``parent/name`` emptied and made anew (``parent`` must be an owned ``--out``)."""
    parent = Path(parent)
    if not owned(parent):
        claim(parent)
    p = parent / name
    if os.path.lexists(p):
        _remove(p)
    p.mkdir()
    return p


def write_file(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` (in an owned folder) with ``text``; a link there is removed, not followed."""
    p = Path(path)
    if os.path.lexists(p):
        _remove(p)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(p, flags, 0o644)
    # backslashreplace: a lone surrogate that reached the text is written as an escape, never
    # raised on after the whole run (safe.py OUTPUT_ERRORS; runner/ does not import report/)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(text)


def new_run_dir(out: str | None) -> tuple[Path, bool]:
    """(run dir, is_temporary). Under --out (a folder torchdoctor owns) the run dir ``run`` of an
    earlier run there is replaced; without it, a new temporary folder."""
    if out:
        return fresh_subdir(out, "run"), False
    return Path(tempfile.mkdtemp(prefix="torchdoctor-run-")), True
