"""``--out DIR`` (issue 14 item 11): checked before any work (exit 2, one line), one run at a
time, never a user's file deleted or written through a link."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli
from proc_helpers import Watched, kill_leftovers

PROC = ROOT / "tests" / "fixtures" / "scripts" / "proc"
RUN = ROOT / "tests" / "fixtures" / "scripts" / "run"


def _one_line_usage_error(p, text: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert text in p.stderr and "Traceback" not in p.stderr
    assert "running" not in p.stderr  # refused before the run started


def test_out_pointing_at_a_file_is_exit_2_before_the_run(tmp_path, cli_inproc):
    f = tmp_path / "file.txt"
    f.write_text("mine")
    p = cli_inproc("checkup", "--out", f, "healthy.py", cwd=RUN)  # in-process, the run forbidden
    _one_line_usage_error(p, "is a file, not a folder")
    assert f.read_text() == "mine"


def test_out_that_cannot_be_created_is_exit_2_before_the_run(tmp_path, cli_inproc):
    f = tmp_path / "file.txt"
    f.write_text("mine")
    p = cli_inproc("checkup", "--out", f / "sub", "healthy.py", cwd=RUN)  # in-process, the run forbidden
    _one_line_usage_error(p, "cannot create the folder")


def test_checkpoint_audit_checks_out_before_the_audit(tmp_path, cli_inproc):
    f = tmp_path / "file.txt"
    f.write_text("mine")
    p = cli_inproc("checkpoint-audit", "--out", f, tmp_path / "missing.pt")
    assert p.returncode == 2 and "is a file, not a folder" in p.stderr


def test_a_folder_with_the_users_files_is_refused_and_left_alone(tmp_path, cli_inproc):
    """`--out .` in a project folder used to delete its run/meta.json, report.json ..."""
    (tmp_path / "report.json").write_text("the user's")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "events.jsonl").write_text("the user's too")
    p = cli_inproc("checkup", "--out", ".", str(RUN / "healthy.py"), cwd=tmp_path)  # in-process, the run forbidden
    _one_line_usage_error(p, "is not empty and was not made by torchdoctor")
    assert (tmp_path / "report.json").read_text() == "the user's"
    assert (tmp_path / "run" / "events.jsonl").read_text() == "the user's too"


@pytest.mark.slow
def test_a_symlinked_report_is_not_followed(tmp_path, monkeypatch):
    """A real run fills --out; the second command's run is a stand-in (in-process): the claim of
    its own folder and the writing of the report through a link are what is checked there."""
    from conftest import run_main
    from torchdoctor.findings import Report

    out = tmp_path / "o"
    p = run_cli("checkup", "--steps", "2", "--out", out, "healthy.py", cwd=RUN)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "run" / "events.jsonl").exists()  # --out keeps the run dir and the report
    assert json.loads((out / "report.json").read_text())["command"] == "checkup"
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    (out / "report.txt").unlink()
    (out / "report.txt").symlink_to(outside)
    ran = []
    monkeypatch.setattr("torchdoctor.pipeline.run.run_probe",
                        lambda probe, target, *a, **k: ran.append(target) or Report(probe, target=target))
    p = run_main("checkup", "--steps", "2", "--out", out, "healthy.py", cwd=RUN)
    assert p.returncode == 0 and ran, p.stderr[-2000:]
    assert outside.read_text() == "keep me"
    assert not (out / "report.txt").is_symlink() and "checkup" in (out / "report.txt").read_text()
    assert json.loads((out / "report.json").read_text())["command"] == "checkup"


@pytest.mark.slow
def test_a_second_run_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "o"
    first = Watched("checkup", "--json", "--steps", "12", "--out", out, "slow_steps.py", cwd=PROC)
    try:
        first.wait_for(b"running", timeout=60)
        t0 = time.monotonic()
        p = run_cli("checkup", "--json", "--steps", "2", "--out", out, "slow_steps.py", cwd=PROC)
        assert time.monotonic() - t0 < 30
        _one_line_usage_error(p, "is in use by another torchdoctor run")
        assert p.stdout == ""
        rc, stdout = first.finish(timeout=200)
        assert rc == 0, first.err[-2000:]
        r = json.loads(stdout)
        assert r["metrics"]["steps"]["count"] == 12  # its evidence alone
        assert json.loads((out / "report.json").read_text())["metrics"]["steps"]["count"] == 12
    finally:
        kill_leftovers(list(first.seen))


def test_claim_unit(tmp_path):
    """The same rules in-process: new/empty/own folders are claimed, the lock is exclusive."""
    from torchdoctor.errors import DoctorError
    from torchdoctor.runner import outdir

    d = tmp_path / "new"
    assert outdir.claim(d) == d.resolve() and outdir.owned(d)
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from torchdoctor.runner import outdir\n"
            "from torchdoctor.errors import DoctorError\n"
            "try:\n    outdir.claim(sys.argv[1])\nexcept DoctorError as e:\n    print(e.message)\n")
    other = subprocess.run([sys.executable, "-c", code, str(d), str(ROOT)], capture_output=True,
                           text=True, timeout=60)
    assert "in use by another torchdoctor run" in other.stdout
    outdir.release_all()
    other = subprocess.run([sys.executable, "-c", code, str(d), str(ROOT)], capture_output=True,
                           text=True, timeout=60)
    assert other.stdout == ""  # free again
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("x")
    with pytest.raises(DoctorError):
        outdir.claim(tmp_path / "theirs")
