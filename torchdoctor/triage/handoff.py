"""`ask ... --run SCRIPT ARGS...`: run the probe of the first route on the user's script.

The probe is run through its own command (``torchdoctor profile|memory|nan|dist|checkup|
checkpoint-audit``), so its options, output and exit code are exactly the command's. Needs the
script probes (``torchdoctor.probes.run``) and the probe's command; without them this exits 2 with a
clear message.
"""

from __future__ import annotations

import importlib.util

from torchdoctor.errors import DoctorError
from torchdoctor.triage.symptoms import AG, CKPT, DBG, DIST, MEM, MOD, MP, PERF

# skill -> the command that measures it first (CONTRACT.md; gradcheck is planned, not built)
PROBE_COMMAND = {PERF: "profile", MEM: "memory", DBG: "nan", DIST: "dist", CKPT: "checkpoint-audit",
                 MOD: "checkup", MP: "profile", AG: "checkup"}

NEEDS_PROBES = "--run needs the script probes"


def probe_argv(skill: str, script_argv: list[str], as_json: bool = False) -> list[str]:
    """The torchdoctor command line that runs ``skill``'s probe on ``script_argv``."""
    return [PROBE_COMMAND[skill], *(["--json"] if as_json else []), *script_argv]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


def run_probe_for_route(skill: str, script_argv: list[str], as_json: bool = False,
                        route: dict | None = None) -> int:
    """Run the probe for ``skill`` on ``script_argv`` (SCRIPT ARGS... or PATH); returns its exit code."""
    if skill not in PROBE_COMMAND:
        raise DoctorError(f"no probe for skill {skill!r}")
    command = PROBE_COMMAND[skill]
    module = f"torchdoctor.commands.{command.replace('-', '_')}"
    if not _importable("torchdoctor.probes.run") or not _importable(module):
        raise DoctorError(NEEDS_PROBES, hint=f"run it yourself once they land: torchdoctor {command} "
                          + " ".join(script_argv))
    from torchdoctor.cli import run_app
    from torchdoctor.commands._common import ATTACHED_METRICS

    if route is not None:
        ATTACHED_METRICS["route"] = route
    return run_app(probe_argv(skill, script_argv, as_json))
