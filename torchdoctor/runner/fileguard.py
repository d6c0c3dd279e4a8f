"""Re-runs leave the user's files as the command's main run left them (do no harm).

``repro``, ``treat``, ``compile``'s eager run, the follow-ups and the resume check run the user's
script again, under a variation (a treatment, torch.compile off, anomaly mode, a state reset,
a shorter run). Each of those runs writes what the script writes: its checkpoint, its log, its
metrics file. Left as they are, the user's files after the command would be those of the last
re-run (a treated, shorter or altered training), not what a plain run of the script leaves. So a
re-run is *guarded*:

* **child** (:func:`install`, before the script runs): an audit hook (``sys.addaudithook``) sees
  every ``open`` for writing, ``os.rename``/``os.replace`` (both ends), ``os.remove``/``unlink``
  (``shutil.rmtree`` included), ``os.truncate``, ``os.mkdir``, ``os.symlink``/``os.link``; and
  ``torch.save`` is wrapped (torch writes an ASCII path from C++, which no audit event sees). The
  first time a path outside the run dir and its private TMPDIR is about to change, a regular file
  there is copied into ``RUN_DIR/guard/`` (then its manifest line is written: a run killed before
  the line has not touched the file yet), or its absence is noted.
* **parent** (:func:`restore`, once every process of the run is gone): each file is put back as
  it was before the run (content, mode, times), and what the run created is removed (folders only
  when empty). ``RUN_DIR/guard/`` is then removed, also under ``--out``.

**Ranks** (a re-run launched through torchrun: ranked ``treat`` trials, the ranked resume check):
each rank guards its own writes in ``D/rank{R}`` (the other ranks' dirs are torchdoctor's), every
copy stamped with when it was taken; the parent restores from all the ranks' manifests at once,
each path from the copy taken first (a later rank's copy of a file two ranks write holds the
first rank's write).

Bounds: at most ``MAX_KEEP_BYTES`` copied per run (a path over it is listed as not restored, and
said on stderr), ``MAX_PATHS`` paths. Not seen: writes by other processes than the script's
interpreter and its forked workers (a ``subprocess``), and by native code other than
``torch.save`` (e.g. ``safetensors.save_file``, written by Rust). Never imports torch itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

GUARD = "guard"  # the folder of kept copies, in the run dir
MANIFEST = "guard.jsonl"
MAX_KEEP_BYTES = 4 << 30
MAX_PATHS = 10_000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_EVENTS = frozenset({"open", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.mkdir", "os.symlink",
                     "os.link"})
_SKIP_PREFIXES = ("/dev/", "/proc/", "/sys/")


class _Guard:
    def __init__(self, run_dir: Path, tmp: str | None, also_skip: str | None = None):
        self.run_dir = str(run_dir.resolve())
        self.skip = tuple(p.rstrip(os.sep) + os.sep for p in (self.run_dir, tmp, also_skip) if p)
        (run_dir / GUARD).mkdir(exist_ok=True)
        self.fd = os.open(run_dir / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.seen: set[str] = set()
        self.done: set[Any] = set()  # absolute paths as the script gave them, already handled
        self.kept_bytes = 0
        self.live = True
        self.lock = threading.Lock()
        self.local = threading.local()
        # a forked DataLoader worker inherits the hook: a lock another thread held at the fork
        # would be held forever there
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()

    # -- the audit hook ------------------------------------------------------------------------
    def __call__(self, event: str, args: tuple) -> None:
        if event not in _EVENTS or not self.live:
            return
        if event == "open":  # the common case, read opens (imports, data), leaves at once
            mode = args[1] if len(args) > 1 else None
            if isinstance(mode, str):
                if "w" not in mode and "a" not in mode and "x" not in mode and "+" not in mode:
                    return
            elif not (len(args) > 2 and isinstance(args[2], int) and args[2] & _WRITE_FLAGS):
                return
            if isinstance(args[0], str) and args[0] in self.done:  # already kept (a log appended every step)
                return
        if getattr(self.local, "busy", False):
            return
        self.local.busy = True  # our own copies and opens are not the script's
        try:
            for path in self._paths(event, args):
                # a write through a link changes the file it points to; a rename or removal, the link
                self.keep(path, follow=event in ("open", "os.truncate"))
        except Exception:  # noqa: BLE001 - never raise into the script's open()
            pass
        finally:
            self.local.busy = False

    @staticmethod
    def _paths(event: str, args: tuple) -> list[Any]:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(mode, str):
                return [path] if any(c in mode for c in "wax+") else []
            return [path] if isinstance(flags, int) and flags & _WRITE_FLAGS else []
        if event == "os.rename":
            src, dst, src_fd, dst_fd = (tuple(args) + (None,) * 4)[:4]
            return [_at(src, src_fd), _at(dst, dst_fd)]
        if event in ("os.remove", "os.rmdir", "os.mkdir"):
            return [_at(args[0], args[-1] if len(args) > 1 else None)]
        if event in ("os.symlink", "os.link"):
            return [_at(args[1], args[-1] if len(args) > 2 else None)]
        return [args[0]]  # os.truncate

    def keep(self, path: Any, follow: bool = True) -> None:
        """Before ``path`` changes for the first time in this run: copy it (or note its absence)."""
        if isinstance(path, int) or path is None:
            return
        if isinstance(path, str) and path.startswith("/") and follow:
            self.done.add(path)
        p = os.fsdecode(path)
        p = os.path.realpath(p) if follow else os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(p))),
                                                            os.path.basename(p))
        if p.startswith(self.skip) or p.startswith(_SKIP_PREFIXES) or "__pycache__" in p:
            return
        with self.lock:
            if p in self.seen or len(self.seen) >= MAX_PATHS:
                return
            self.seen.add(p)
            # when this rank first saw the path change (ranks of one run: the earliest copy wins)
            rec: dict[str, Any] = {"path": p, "t": time.time()}
            if os.path.islink(p):
                rec["link"] = os.readlink(p)
            elif os.path.isfile(p):
                size = os.path.getsize(p)
                if self.kept_bytes + size > MAX_KEEP_BYTES:
                    rec["not_kept"] = f"over the {MAX_KEEP_BYTES >> 30} GiB kept per re-run"
                else:
                    name = f"{len(self.seen):05d}"
                    tmp = os.path.join(self.run_dir, GUARD, name + ".part")
                    try:
                        shutil.copy2(p, tmp)
                        os.rename(tmp, os.path.join(self.run_dir, GUARD, name))
                        self.kept_bytes += size
                        rec["kept"] = name
                    except OSError as e:  # a full disk, an unreadable file: said, not hidden
                        rec["not_kept"] = f"could not copy it first: {e.strerror or type(e).__name__}"
                        try:
                            os.unlink(tmp)
                        except OSError:
                            pass
            elif os.path.isdir(p):
                rec["dir"] = True
            elif not os.path.lexists(p):
                rec["absent"] = True
            else:
                rec["special"] = True  # a FIFO, a socket, a device: nothing to put back
            os.write(self.fd, (json.dumps(rec) + "\n").encode())


def _at(path: Any, dir_fd: Any) -> Any:
    """``path`` resolved against ``dir_fd`` (``shutil.rmtree`` removes by name in an open folder)."""
    if isinstance(dir_fd, int) and isinstance(path, (str, bytes)) and not os.path.isabs(os.fsdecode(path)):
        try:
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
        except OSError:
            return None
    return path


_GUARD: _Guard | None = None


def install(run_dir: str | os.PathLike, patches: Any = None, also_skip: str | os.PathLike | None = None) -> None:
    """Guard this run (the child, before the script runs). ``patches``: a
    :class:`~torchdoctor.runner.patching.Patches` to wrap ``torch.save`` with. ``also_skip``: a
    folder whose writes are torchdoctor's own (a rank's: the whole ranked run dir)."""
    global _GUARD
    if _GUARD is not None:
        return
    _GUARD = _Guard(Path(run_dir), os.environ.get("TMPDIR"),
                    str(Path(also_skip).resolve()) if also_skip else None)
    sys.addaudithook(_GUARD)  # cannot be removed: stop() makes it inert
    torch = sys.modules.get("torch")
    if torch is not None and patches is not None:
        import functools

        guard = _GUARD

        def make(orig):
            @functools.wraps(orig)
            def save(obj, f, *a, **k):
                if guard.live and isinstance(f, (str, bytes, os.PathLike)):
                    guard.keep(f)
                return orig(obj, f, *a, **k)
            return save

        w = patches.wrap(torch, "save", make, tag="file_guard")
        ser = getattr(torch, "serialization", None)
        if w is not None and ser is not None and getattr(ser, "save", None) is w.__wrapped__:
            patches.set(ser, "save", w, orig=ser.save, tag="file_guard")


def stop() -> None:
    """The script is done: what the harness writes next is its own."""
    if _GUARD is not None:
        _GUARD.live = False


def restore(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Put back what a guarded run changed (the parent, after every process of the run is
    gone); returns {restored, removed, not_restored: [{path, why}]}; never raises."""
    d = Path(run_dir)
    out: dict[str, Any] = {"restored": 0, "removed": 0, "not_restored": []}
    # a ranked run: each rank guarded its own writes in D/rank{R}; a path two ranks changed is put
    # back from the copy taken first (a later rank's copy may hold the first rank's write)
    dirs = [d] + sorted(p for p in d.glob("rank*") if p.is_dir() and (p / MANIFEST).exists())
    first: dict[str, tuple[float, int, Path, dict[str, Any]]] = {}
    n = 0
    for src in dirs:
        try:
            lines = (src / MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: its file was not touched yet
            p = rec.get("path") if isinstance(rec, dict) else None
            if not isinstance(p, str):
                continue
            t = rec.get("t")
            key = (float(t) if isinstance(t, (int, float)) else 0.0, n)
            n += 1
            if p not in first or key < first[p][:2]:
                first[p] = (*key, src, rec)
    # the deepest (created last) first: folders empty before removal
    for _t, _n, src, rec in sorted(first.values(), key=lambda v: (v[0], v[1]), reverse=True):
        p = rec["path"]
        try:
            _restore_one(src, rec, p, out)
        except OSError as e:
            out["not_restored"].append({"path": p, "why": e.strerror or type(e).__name__})
    if not os.environ.get("TORCHDOCTOR_KEEP_RUN"):
        for src in dirs:
            shutil.rmtree(src / GUARD, ignore_errors=True)
            try:
                (src / MANIFEST).unlink()
            except OSError:
                pass
    return out


def _restore_one(d: Path, rec: dict[str, Any], p: str, out: dict[str, Any]) -> None:
    if "not_kept" in rec:
        out["not_restored"].append({"path": p, "why": rec["not_kept"]})
    elif "kept" in rec:
        if os.path.islink(p) or (os.path.lexists(p) and not os.path.isfile(p)):
            _remove(p)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        shutil.copy2(d / GUARD / str(rec["kept"]), p)
        out["restored"] += 1
    elif "link" in rec:
        if os.path.islink(p) and os.readlink(p) == rec["link"]:
            return
        if os.path.lexists(p):
            _remove(p)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(rec["link"], p)
        out["restored"] += 1
    elif rec.get("dir"):
        if not os.path.lexists(p):  # a folder the run removed (its files are put back above)
            os.makedirs(p, exist_ok=True)
    elif rec.get("absent") and os.path.lexists(p):
        if os.path.isdir(p) and not os.path.islink(p):
            if not os.listdir(p):
                os.rmdir(p)
                out["removed"] += 1
        else:
            os.unlink(p)
            out["removed"] += 1


def _remove(p: str) -> None:
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    else:
        os.unlink(p)
