"""CLI conventions (issue 32 item 5): `--html PATH` with a space wherever it is unambiguous."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.cli import _expand_html
from torchdoctor.report.html.output import HTML_DEFAULT, expand_bare_html
from torchdoctor.report.html.page import MARKER

ROOT = Path(__file__).resolve().parents[1]
BARE = f"--html={HTML_DEFAULT}"


def test_a_command_without_positionals_takes_the_next_word_as_the_path():
    assert expand_bare_html(["--html", "report"], set(), True, positional=False) == ["--html=report"]
    assert expand_bare_html(["--html", "--json"], set(), True, positional=False) == [BARE, "--json"]
    assert expand_bare_html(["--json", "--html"], set(), True, positional=False) == ["--json", BARE]


def test_with_a_script_only_an_html_name_is_the_path():
    values = {"--steps"}
    assert expand_bare_html(["--html", "r.html", "train.py", "a"], values, False) == \
        ["--html=r.html", "train.py", "a"]
    assert expand_bare_html(["--html", "R.HTM", "train.py"], values, False) == ["--html=R.HTM", "train.py"]
    assert expand_bare_html(["--html", "train.py", "--html", "x.html"], values, False) == \
        [BARE, "train.py", "--html", "x.html"]  # after SCRIPT: the script's own words
    assert expand_bare_html(["--html", "--", "x.html"], values, True) == [BARE, "--", "x.html"]


@pytest.mark.parametrize("argv, want", [
    (["demo", "--html", "report.html"], ["demo", "--html=report.html"]),
    (["demo", "--html", "report"], ["demo", "--html=report"]),
    (["env", "--json", "--html", "r"], ["env", "--json", "--html=r"]),
    (["--debug", "demo", "--html"], ["--debug", "demo", BARE]),
    (["checkpoint-audit", "--html", "r.html", "ck.pt"], ["checkpoint-audit", "--html=r.html", "ck.pt"]),
    (["checkpoint-audit", "ck.pt", "--html", "r.htm"], ["checkpoint-audit", "ck.pt", "--html=r.htm"]),
    (["checkpoint-audit", "--html", "ck.pt"], ["checkpoint-audit", BARE, "ck.pt"]),
    (["checkup", "--steps", "3", "--html", "r.html", "t.py", "--html", "y.html"],
     ["checkup", "--steps", "3", "--html=r.html", "t.py", "--html", "y.html"]),
    (["checkup", "--html", "t.py"], ["checkup", BARE, "t.py"]),
])
def test_the_cli_expands_each_command_by_its_own_arguments(argv, want):
    assert _expand_html(argv) == want


@pytest.mark.parametrize("command, form", [
    ("demo", "--html PATH"), ("env", "--html PATH"), ("checkup", "--html PATH.html"),
    ("checkpoint-audit", "--html PATH.html"), ("profile", "--html=PATH"), ("dist", "--html PATH.html"),
])
def test_the_help_of_each_command_shows_the_accepted_forms(command, form):
    from conftest import run_main  # in-process: a help text needs no child

    r = run_main(command, "--help", env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert r.returncode == 0, r.stderr
    assert form in " ".join(r.stdout.split())


def test_checkpoint_audit_html_with_a_space_writes_the_page_and_audits_the_checkpoint(tmp_path: Path):
    torch = pytest.importorskip("torch")
    ck = tmp_path / "ck.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, ck)
    before = ck.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "checkpoint-audit", "--json", "--html",
                        "audit.html", "ck.pt"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    assert rep["target"].endswith("ck.pt") and rep["artifacts"]["html"].endswith("audit.html")
    assert (tmp_path / "audit.html").read_text().startswith(MARKER)
    assert ck.read_bytes() == before
