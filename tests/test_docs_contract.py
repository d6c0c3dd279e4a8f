"""docs/contract.md keeps up with the code: every command, option, exit code, status and report key."""

import json
import re
from pathlib import Path

import pytest
import typer.main

from torchdoctor import errors
from torchdoctor.cli import app
from torchdoctor.findings import STATUSES, Report

CONTRACT = (Path(__file__).resolve().parents[1] / "docs" / "contract.md").read_text()
COMMANDS = typer.main.get_command(app).commands


def test_every_command_is_in_the_contract():
    for name in COMMANDS:
        assert re.search(rf"^torchdoctor {re.escape(name)}\b", CONTRACT, re.M), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_of_every_command_is_in_the_contract(name):
    missing = []
    for p in COMMANDS[name].params:
        for flag in [*p.opts, *getattr(p, "secondary_opts", [])]:
            if flag.startswith("--") and flag != "--help" and f"`{flag}" not in CONTRACT \
                    and f"{flag}`" not in CONTRACT and f"/{flag}" not in CONTRACT:
                missing.append(flag)
    assert not missing, f"{name}: options not in docs/contract.md: {missing}"


def test_ask_options_are_in_the_contract():
    from torchdoctor.triage.cli_fast import OPTIONS

    for flag in OPTIONS:
        assert f"`{flag}" in CONTRACT, flag


def test_every_exit_code_is_in_the_table():
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", CONTRACT, re.M))
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert {str(c) for c in codes} == set(rows), rows.keys()


def test_every_status_and_report_key_is_in_the_schema():
    block = CONTRACT.split("## The JSON report", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    example = json.loads(block)
    assert list(example) == list(Report(command="x").to_dict())
    assert example["status"].split(" | ") == list(STATUSES)
    assert list(example["findings"][0]) == ["code", "skill", "severity", "title", "evidence", "fix", "docs"]


def test_ask_schema_lists_the_answer_keys():
    from torchdoctor.triage.answer import Answer

    block = CONTRACT.split("`ask --json` prints", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    example = json.loads(block)
    assert list(example) == list(Answer(query="q", source="args", mode="query", lines=1).to_dict())
