"""The user's own files, as the script as it is wrote them, kept across torchdoctor's altered runs.

``repro`` runs the script again under variations the user did not ask for: the resume check's
restarts (a state reset after a save, issue 27 item 4: the script's ``ckpt_user.pt`` was left
holding a restart's state), the localising pair (stopped at the divergent step), the
deterministic pair (other kernels). Each writes the script's checkpoints again, to the user's
paths. So, before such runs, the files that a run of the script as it is wrote are kept aside,
and after them every kept file is put back as that run left it: the user's checkpoints end as a
plain run leaves them. (A file the altered runs created that the plain run did not write is left
where it is: nothing of the user's is ever deleted. The altered runs stop at or before the plain
run's last step, so they write a subset of its files.)

Which files: those in the folders the script saved checkpoints to (the save audit's ``save``
events: ``folder``), modified since that run started (its ``meta.json`` ``started``): the
checkpoints, a file renamed into place after the save (``tmp.pth.tar`` → ``last.pth.tar``), the
logs written beside them. A DCP save writes a folder (``target`` ``folder``: ``step3/`` holding
``.metadata`` and one ``__R_0.distcp`` per rank) and the next saves write its siblings
(``step6/``, ``step9/``, of which only the first saves are described): for those, the folder
*above* the checkpoint folder is searched, ``DEPTH`` levels down. On N ranks this is the one
guard of the restarts (a rank's child does not guard its own writes: ``runner/harness.py``), so
it is what keeps the user's DCP folders as the baseline left them. Files elsewhere (a log in another folder, a file written by ``open``
only) are not seen. At most ``MAX_FILES`` files and ``MAX_BYTES`` in all, and only while the
disk keeps ``MIN_FREE_BYTES`` free after the copy: beyond that the altered runs do not run
(:meth:`OwnFiles.refused` says why) rather than leave the user's files changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

MAX_FILES = 256
MAX_BYTES = 8 << 30  # 8 GiB of the user's files kept aside at most
MIN_FREE_BYTES = 1 << 30  # the disk keeps 1 GiB free after the copy
SLACK_S = 2.0  # file-system timestamps vs the parent's clock
DEPTH = 2  # levels searched below the folder above a DCP checkpoint folder


def _folders(run: Any) -> list[tuple[str, int]]:
    """(folder, levels searched below it) of the run's saves (of every rank's, on N ranks)."""
    out: list[tuple[str, int]] = []
    runs = list((getattr(run, "ranks", None) or {}).values()) or [run]
    for r in runs:
        for s in r.evidence.of("save"):
            f = s.get("folder")
            if not isinstance(f, str):
                continue
            if s.get("target") == "folder":  # a DCP checkpoint folder: its siblings are the next saves
                f, depth = os.path.dirname(f.rstrip(os.sep)) or f, DEPTH
            elif s.get("target") == "file":
                depth = 0
            else:
                continue
            if os.path.isdir(f) and all(f != d for d, _ in out):
                out.append((f, depth))
    return out


class OwnFiles:
    """The files a run of the script as it is wrote (module doc); ``keep()`` then ``restore()``."""

    def __init__(self, run: Any) -> None:
        self.folders = _folders(run)
        self.since = float(run.evidence.meta.get("started") or 0.0) - SLACK_S
        self.kept: dict[str, tuple[str, int, int]] = {}  # path -> (copy, size, mtime_ns)
        self.scratch: str | None = None
        self.refused: str | None = None
        self.restored: list[str] = []

    def _written(self) -> list[tuple[str, os.stat_result]]:
        out: list[tuple[str, os.stat_result]] = []
        seen: set[str] = set()
        todo = list(self.folders)
        while todo and len(out) <= MAX_FILES:
            d, depth = todo.pop(0)
            try:
                with os.scandir(d) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False) and depth > 0:
                            todo.append((e.path, depth - 1))
                        elif e.is_file(follow_symlinks=False) and e.path not in seen:
                            st = e.stat(follow_symlinks=False)
                            if st.st_mtime >= self.since:
                                seen.add(e.path)
                                out.append((e.path, st))
            except OSError:
                continue
        return out

    def keep(self) -> bool:
        """Copy the files aside; False (and ``refused``) when they are too many or too large."""
        if not self.folders:
            return True
        files = self._written()
        total = sum(st.st_size for _p, st in files)
        if len(files) > MAX_FILES or total > MAX_BYTES:
            self.refused = (f"the script's own files next to its checkpoints ({len(files)} files, "
                            f"{total / 2**20:.0f} MB) are more than torchdoctor keeps aside "
                            f"({MAX_FILES} files, {MAX_BYTES >> 30} GB) to put them back after its "
                            f"own runs")
            return False
        self.scratch = tempfile.mkdtemp(prefix="torchdoctor-keep-")
        if shutil.disk_usage(self.scratch).free - total < MIN_FREE_BYTES:
            self.refused = (f"not enough free disk to keep the script's own files ({total / 2**20:.0f} MB) "
                            f"aside while torchdoctor's own runs write them")
            self.cleanup()
            return False
        for i, (path, st) in enumerate(files):
            copy = os.path.join(self.scratch, str(i))
            shutil.copy2(path, copy)
            self.kept[path] = (copy, st.st_size, st.st_mtime_ns)
        return True

    def restore(self) -> None:
        """Put every kept file back as it was kept (only where it changed)."""
        for path, (copy, size, mtime_ns) in self.kept.items():
            try:
                st = os.stat(path)
                if st.st_size == size and st.st_mtime_ns == mtime_ns:
                    continue
            except OSError:
                pass
            tmp = f"{path}.torchdoctor-restore"
            shutil.copy2(copy, tmp)
            os.replace(tmp, path)
            self.restored.append(path)
        self.cleanup()

    def cleanup(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def summary(self) -> dict[str, Any]:
        return {"kept": len(self.kept), "restored": len(self.restored),
                **({"refused": self.refused} if self.refused else {})}
