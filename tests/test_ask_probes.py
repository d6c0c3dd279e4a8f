"""`ask` routes to the probes that measure each question: treat after a performance measurement,
repro for reproducibility, gradcheck for a custom backward, compile for torch.compile symptoms.

treat, repro, gradcheck and compile are built in parallel (issues 16-19) and merged by the lead:
``PENDING_COMMANDS`` lists those not registered in this checkout yet. A route may name them; once
one is registered, ``test_pending_commands_are_not_registered_yet`` fails until it is removed
from the set, so that from then on the route is checked against the real command.
"""

from __future__ import annotations

import json

import pytest

from torchdoctor.triage import matcher
from torchdoctor.triage.handoff import command_of, script_of

PENDING_COMMANDS: frozenset[str] = frozenset()


def registered_commands() -> set[str]:
    import typer.main

    from torchdoctor.cli import app

    return set(typer.main.get_command(app).commands)


def known_commands() -> set[str]:
    return registered_commands() | PENDING_COMMANDS


def test_pending_commands_are_not_registered_yet():
    merged = PENDING_COMMANDS & registered_commands()
    assert not merged, f"registered now: remove {sorted(merged)} from PENDING_COMMANDS in tests/test_ask_probes.py"


@pytest.mark.parametrize("query, probe", [
    # performance: measure first (profile); treat is offered after the measurement
    ("training is slow", "torchdoctor profile SCRIPT"),
    ("my GPU utilization is only 30%", "torchdoctor profile SCRIPT"),
    # torch.compile symptoms: graph breaks, recompiles, compile slow or not faster
    ("lots of graph breaks with torch.compile", "torchdoctor compile SCRIPT"),
    ("my model recompiles every step", "torchdoctor compile SCRIPT"),
    ("torch._dynamo hit config.recompile_limit (8)", "torchdoctor compile SCRIPT"),
    ("torch.compile makes my model slower", "torchdoctor compile SCRIPT"),
    ("compile is slow", "torchdoctor compile SCRIPT"),
    ("my model is not faster with torch.compile", "torchdoctor compile SCRIPT"),
    ("torch.compile takes forever to compile and the speedup is tiny", "torchdoctor compile SCRIPT"),
    # reproducibility
    ("two runs with the same seed give different losses", "torchdoctor repro SCRIPT"),
    ("my results are not reproducible", "torchdoctor repro SCRIPT"),
    ("how do I make training deterministic", "torchdoctor repro SCRIPT"),
    ("how do I seed everything", "torchdoctor repro SCRIPT"),
    # checkpoints stay with the file audit
    ("resume from checkpoint", "torchdoctor checkpoint-audit PATH"),
    ("my checkpoint is missing the optimizer state", "torchdoctor checkpoint-audit PATH"),
    # custom backward
    ("my custom backward gives wrong gradients", "torchdoctor gradcheck SCRIPT"),
    ("is my torch.autograd.Function correct?", "torchdoctor gradcheck SCRIPT"),
    ("gradcheck fails for my custom op", "torchdoctor gradcheck SCRIPT"),
])
def test_the_first_route_names_the_probe_that_measures_it(query, probe):
    a = matcher.triage(query)
    assert a.routes and a.routes[0].probe == probe, [(r.skill, r.probe) for r in a.routes]
    assert a.routes[0].steps[0]["by"] == probe  # its playbook starts with that measurement
    assert a.next_command == probe


def test_a_stronger_other_symptom_keeps_its_own_route():
    """torch.compile mentioned beside an OOM: memory first, compile second; a checkpoint question
    that also asks for reproducible runs stays the checkpoint audit (saving came first)."""
    a = matcher.triage("OOM and I use torch.compile")
    assert [r.probe for r in a.routes] == ["torchdoctor memory SCRIPT", "torchdoctor compile SCRIPT"]
    a = matcher.triage("I need to save my training state and resume exactly; results should also be "
                       "reproducible across runs")
    assert a.routes[0].probe == "torchdoctor checkpoint-audit PATH"
    text = " ".join(s["by"] for s in a.routes[0].steps)
    assert "torchdoctor repro --resume-check SCRIPT" in text  # exact resume, verified


def test_slow_training_offers_treat_after_the_measurement():
    a = matcher.triage("training is slow")
    r = a.routes[0]
    assert r.probe == "torchdoctor profile SCRIPT" and r.after == "torchdoctor treat SCRIPT"
    assert r.to_dict()["after"] == "torchdoctor treat SCRIPT"
    assert any(s["by"] == "torchdoctor treat SCRIPT" for s in r.steps)
    a.script = "train.py"
    run = a.route_for_run()
    assert run["probe"] == "torchdoctor profile train.py" and run["after"] == "torchdoctor treat train.py"
    assert "after" not in matcher.triage("loss is nan").routes[0].to_dict()


def test_the_route_section_shows_the_next_step_under_the_probes_report():
    from rich.console import Console

    from torchdoctor.findings import Report
    from torchdoctor.report.sections.route import route_section

    a = matcher.triage("training is slow")
    a.script = "train.py"
    rep = Report.__new__(Report)
    rep.metrics = {"route": a.route_for_run()}
    con = Console(width=200, record=True)
    con.print(route_section(rep))
    out = con.export_text()
    assert "measuring now: torchdoctor profile train.py" in out and "then: torchdoctor treat train.py" in out


@pytest.mark.parametrize("probe, command", [
    ("torchdoctor profile SCRIPT", "profile"), ("torchdoctor repro SCRIPT", "repro"),
    ("torchdoctor checkpoint-audit PATH", "checkpoint-audit"), ("torchdoctor dist [SCRIPT]", "dist"),
    ("torchdoctor compile SCRIPT", "compile"), ("torchdoctor gradcheck SCRIPT", "gradcheck"),
])
def test_the_command_of_a_routes_probe(probe, command):
    assert command_of(probe) == command


def test_script_of_takes_a_command_as_well_as_a_skill():
    from torchdoctor.triage.symptoms import PERF

    assert script_of("repro", ["--steps", "3", "train.py", "--lr", "1"]) == "train.py"
    assert script_of(PERF, ["train.py"]) == script_of("profile", ["train.py"]) == "train.py"


def test_run_hands_off_to_the_routes_command_or_says_it_is_not_installed(monkeypatch, capsys):
    """`ask "..." --run SCRIPT`: the command the route names (compile, not the skill's profile);
    where that command is not installed: exit 2 and one clear line, no traceback."""
    from torchdoctor.triage import cli_fast, handoff

    seen = {}
    real = handoff._importable
    monkeypatch.setattr(handoff, "_importable", lambda name: False if name.startswith(
        "torchdoctor.commands.") and name.endswith(".compile") else real(name))
    code = cli_fast.main(["graph", "breaks", "with", "torch.compile", "--run", "train.py"])
    err = capsys.readouterr().err
    assert code == 2 and "`torchdoctor compile` is not in this installation" in err
    assert "torchdoctor compile train.py" in err and "Traceback" not in err

    monkeypatch.setattr(handoff, "_importable", lambda name: True)
    import torchdoctor.cli as cli_mod

    monkeypatch.setattr(cli_mod, "run_app", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli_fast.main(["two", "runs", "with", "the", "same", "seed", "differ", "--json", "--run",
                          "--steps", "3", "train.py", "--lr", "1"]) == 0
    assert seen["argv"] == ["repro", "--json", "--steps", "3", "train.py", "--lr", "1"]


def test_ask_json_lists_after_only_where_there_is_one(cli):
    d = json.loads(cli("ask", "training is slow", "--json").stdout)
    assert d["routes"][0]["after"] == "torchdoctor treat SCRIPT" and d["next"] == "torchdoctor profile SCRIPT"
    d = json.loads(cli("ask", "graph breaks with torch.compile", "--json").stdout)
    assert d["routes"][0]["probe"] == "torchdoctor compile SCRIPT" and "after" not in d["routes"][0]


def test_the_attached_route_is_for_one_report_only(monkeypatch):
    """Regression: the route `ask --run` attached stayed in ATTACHED_METRICS, so a later report in
    the same process (a checkpoint audit in the test session) carried `metrics.route`."""
    import torchdoctor.cli
    from torchdoctor.commands._common import ATTACHED_METRICS
    from torchdoctor.triage.handoff import run_probe_for_route

    seen = []
    monkeypatch.setattr(torchdoctor.cli, "run_app", lambda argv: seen.append(dict(ATTACHED_METRICS)) or 0)
    assert run_probe_for_route("profile", ["train.py"], route={"skill": "x"}) == 0
    assert seen == [{"route": {"skill": "x"}}] and ATTACHED_METRICS == {}
