"""`ask ... --run SCRIPT ARGS...`: run the probe of the first route on the user's script.

The probe is run through its own command (``torchdoctor profile|memory|nan|dist|checkup|
checkpoint-audit|gradcheck|repro|compile``: the one the first route names), so its options, output
and exit code are exactly the command's. Needs the
script probes (``torchdoctor.pipeline.run``) and the probe's command; without them this exits 2 with a
clear message.
"""

from __future__ import annotations

import importlib.util

from torchdoctor.errors import DoctorError
from torchdoctor.triage.playbooks import PLAYBOOKS, VARIANTS

NEEDS_PROBES = "--run needs the script probes"


def command_of(probe: str) -> str:
    """The command of a route's probe line: "torchdoctor repro SCRIPT" -> "repro"."""
    words = probe.split()
    return words[1] if len(words) > 1 and words[0] == "torchdoctor" else words[0]


# skill -> the command that measures it first (its playbook's probe, docs/contract.md), and the
# commands of the playbook variants (repro, compile) a route may name instead
PROBE_COMMAND = {pb.skill: command_of(pb.probe) for pb in PLAYBOOKS.values()}
ROUTE_COMMANDS = frozenset(command_of(pb.probe) for pb in VARIANTS.values())


def _command(skill_or_command: str) -> str:
    return PROBE_COMMAND.get(skill_or_command, skill_or_command)


def probe_argv(skill: str, script_argv: list[str], as_json: bool = False) -> list[str]:
    """The torchdoctor command line that runs ``skill``'s probe (or a command) on ``script_argv``."""
    return [_command(skill), *(["--json"] if as_json else []), *script_argv]


def script_of(skill: str, script_argv: list[str]) -> str | None:
    """SCRIPT (or ``-m MODULE``, or PATH) in ``script_argv``, after any of the probe's own options.

    ``ask ... --run --steps 3 train.py --lr 1``: the probe's options may come first; the first word
    that is neither an option nor an option's value is the target. Reads the probe command's
    declared options (typer is loaded here anyway: the probe is about to run).
    """
    flags: set[str] = set()
    valued: set[str] = set()
    try:
        import typer.main

        from torchdoctor.cli import app

        commands = typer.main.get_command(app).commands
        # a command not in this installation: the options every script probe shares (_script.py)
        cmd = commands.get(_command(skill)) or commands.get("checkup")
        for p in getattr(cmd, "params", []):
            if p.param_type_name != "option":
                continue
            (flags if getattr(p, "is_flag", False) else valued).update([*p.opts, *p.secondary_opts])
    except Exception:  # noqa: BLE001 - without the declarations, take the first word as before
        pass
    i = 0
    while i < len(script_argv):
        tok = script_argv[i]
        if tok in ("-m", "--module"):
            return f"-m {script_argv[i + 1]}" if i + 1 < len(script_argv) else None
        if tok == "--":
            return script_argv[i + 1] if i + 1 < len(script_argv) else None
        if tok.startswith("-") and len(tok) > 1:
            i += 2 if tok in valued else 1
            continue
        return tok
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


def run_probe_for_route(skill: str, script_argv: list[str], as_json: bool = False,
                        route: dict | None = None) -> int:
    """Run the probe for ``skill`` (a skill, or the command a route named) on ``script_argv`` (SCRIPT
    ARGS... or PATH); returns its exit code."""
    if skill not in PROBE_COMMAND and skill not in set(PROBE_COMMAND.values()) | ROUTE_COMMANDS:
        raise DoctorError(f"no probe for skill {skill!r}")
    command = _command(skill)
    module = f"torchdoctor.commands.{command.replace('-', '_')}"
    if not _importable("torchdoctor.pipeline.run"):
        raise DoctorError(NEEDS_PROBES, hint=f"run it yourself once they land: torchdoctor {command} "
                          + " ".join(script_argv))
    if not _importable(module):
        raise DoctorError(f"--run: `torchdoctor {command}` is not in this installation",
                          hint=f"run it yourself once it lands: torchdoctor {command} " + " ".join(script_argv))
    from torchdoctor.cli import run_app
    from torchdoctor.commands._common import ATTACHED_METRICS

    if route is not None:
        ATTACHED_METRICS["route"] = route
    try:
        return run_app(probe_argv(skill, script_argv, as_json))
    finally:  # for this one report: a later command in the same process must not carry it
        ATTACHED_METRICS.pop("route", None)
