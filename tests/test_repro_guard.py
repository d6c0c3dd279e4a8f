"""OwnFiles (reprocheck/guard.py): the user's files written by the script as it is, kept aside
across torchdoctor's altered runs (resume restarts, the localising and deterministic pairs) and
put back as they were (issue 27 item 4)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from torchdoctor.evidence import Evidence
from torchdoctor.reprocheck import guard
from torchdoctor.reprocheck.guard import OwnFiles


def _run(folder, started):
    ev = Evidence.from_events([{"kind": "save", "target": "file", "folder": str(folder), "name": "ckpt.pt"},
                               {"kind": "save", "target": "memory"}], meta={"started": started})
    return SimpleNamespace(evidence=ev)


def test_files_changed_by_altered_runs_are_put_back_and_others_left(tmp_path):
    old = tmp_path / "notes.txt"
    old.write_text("the user's, from before the run")
    past = time.time() - 3600
    os.utime(old, (past, past))
    started = time.time()
    (tmp_path / "ckpt.pt").write_bytes(b"plain run, step 9")
    (tmp_path / "last.pth.tar").write_bytes(b"renamed into place by the plain run")
    own = OwnFiles(_run(tmp_path, started))
    assert own.keep() and len(own.kept) == 2  # notes.txt predates the run: not the script's output
    (tmp_path / "ckpt.pt").write_bytes(b"restart, step 6")  # an altered run rewrites the checkpoint
    (tmp_path / "new.pt").write_bytes(b"made by an altered run")
    own.restore()
    assert (tmp_path / "ckpt.pt").read_bytes() == b"plain run, step 9"
    assert (tmp_path / "last.pth.tar").read_bytes() == b"renamed into place by the plain run"
    assert own.summary() == {"kept": 2, "restored": 1}
    assert (tmp_path / "new.pt").exists() and old.read_text() == "the user's, from before the run"  # nothing deleted
    assert own.scratch is None


def test_too_many_bytes_refuses_rather_than_leave_files_changed(tmp_path, monkeypatch):
    started = time.time()
    (tmp_path / "ckpt.pt").write_bytes(b"x" * 1000)
    monkeypatch.setattr(guard, "MAX_BYTES", 999)
    own = OwnFiles(_run(tmp_path, started))
    assert not own.keep() and "more than torchdoctor keeps aside" in own.refused


def test_a_run_that_saved_nothing_to_a_file_keeps_nothing(tmp_path):
    own = OwnFiles(SimpleNamespace(evidence=Evidence.from_events([], meta={})))
    assert own.keep() and own.summary() == {"kept": 0, "restored": 0}
    own.restore()
