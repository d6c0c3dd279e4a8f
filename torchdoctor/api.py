"""The Python API for notebooks and agents: each probe run as the CLI runs it, in a subprocess.

    import torchdoctor
    rep = torchdoctor.checkup("train.py", args=["--epochs", "1"], steps=50)
    rep.status, [f.code for f in rep.findings], rep.metrics["steps"]["median_step_ms"]
    rep            # in Jupyter: the HTML report (_repr_html_)
    from torchdoctor import api
    api.memory("train.py", steps=30); api.compare("before.json", "after.json")

``memory``, ``treat``, ``gradcheck`` and ``compare`` are in this module only (``torchdoctor.api``):
those names are also subpackages of ``torchdoctor``, which would shadow them there.

Every call runs ``python -m torchdoctor COMMAND --json ...`` in a child process (never in the
caller's: the caller's torch, CUDA context, signal handlers and globals are left alone, and a
script that crashes or hangs cannot take the notebook with it) and returns a :class:`RunReport`:
the JSON report's fields as attributes (``findings``/``skipped`` as the same ``Finding``/``Skipped``
objects the CLI renders), plus ``exit_code`` and the child's ``stderr``. Bad usage (exit 2) and a
torchdoctor failure (exit 3) raise :class:`TorchdoctorError` with the CLI's message. Nothing here
imports torch; ``import torchdoctor`` stays light (the names are resolved on first use).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from torchdoctor.findings import Finding, Skipped

PROBES = ("checkup", "profile", "memory", "nan", "compile", "treat", "repro", "gradcheck")


class TorchdoctorError(RuntimeError):
    """The command did not produce a report (bad usage: exit 2; torchdoctor failed: exit 3)."""

    def __init__(self, message: str, exit_code: int, stderr: str = ""):
        super().__init__(message)
        self.exit_code, self.stderr = exit_code, stderr


@dataclass
class RunReport:
    """A report as the JSON has it (docs/json.md; schema: ``torchdoctor schema``)."""

    tool: str
    version: str
    schema: int
    command: str
    target: str | None
    status: str
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    stderr: str = field(default="", repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], exit_code: int = 0, stderr: str = "") -> "RunReport":
        findings = [Finding(**{k: f.get(k) for k in ("code", "skill", "severity", "title")},
                            evidence=f.get("evidence") or {}, fix=f.get("fix") or "", docs=f.get("docs") or "")
                    for f in data.get("findings") or []]
        skipped = [Skipped(s.get("rule", ""), s.get("reason", "")) for s in data.get("skipped") or []]
        return cls(data.get("tool", "torchdoctor"), data.get("version", ""), data.get("schema", 0),
                   data.get("command", ""), data.get("target"), data.get("status", ""), findings, skipped,
                   data.get("metrics") or {}, data.get("artifacts") or {}, data.get("context") or {},
                   exit_code, stderr)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report, key for key."""
        return {"tool": self.tool, "version": self.version, "schema": self.schema, "command": self.command,
                "target": self.target, "status": self.status, "findings": [f.to_dict() for f in self.findings],
                "skipped": [s.to_dict() for s in self.skipped], "metrics": self.metrics,
                "artifacts": self.artifacts, "context": self.context}

    def to_json(self) -> str:
        from torchdoctor.report.jsonout import dumps

        return dumps(self.to_dict())

    def _repr_html_(self) -> str:
        from torchdoctor.report.html import render_html

        return render_html(self.to_dict())


def _options(steps: int | None, timeout: float | None, out: str | os.PathLike | None,
             fail_on: str | None, options: Sequence[str]) -> list[str]:
    opts: list[str] = []
    if steps is not None:
        opts += ["--steps", str(int(steps))]
    if timeout is not None:
        opts += ["--timeout", str(float(timeout))]
    if out is not None:
        opts += ["--out", os.fspath(out)]
    if fail_on is not None:
        opts += ["--fail-on", fail_on]
    return opts + [str(o) for o in options]


def run(command: str, *argv: str, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
        wall_timeout: float | None = None) -> RunReport:
    """``torchdoctor COMMAND --json ARGV...`` in a child process; its report.

    ``env``: the child's whole environment (default: this process's). ``wall_timeout``: a bound on
    the child itself, beyond the probe's own ``--timeout`` (the run is stopped at that one first)."""
    argv_full = [sys.executable, "-m", "torchdoctor", command, "--json", *argv]
    try:
        p = subprocess.run(argv_full, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, errors="replace", timeout=wall_timeout)
    except subprocess.TimeoutExpired as e:
        raise TorchdoctorError(f"torchdoctor {command}: no report within {wall_timeout:g} s", 124,
                               str(e.stderr or "")) from None
    text = p.stdout.strip()
    if p.returncode in (2, 3) or not text:
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("torchdoctor:") or ln.startswith("  hint:")]
        msg = "\n".join(lines[-3:]) or p.stderr.strip()[-1000:] or f"exit {p.returncode}, no report"
        raise TorchdoctorError(msg, p.returncode, p.stderr)
    try:
        data = json.loads(text)
    except ValueError:
        raise TorchdoctorError(f"torchdoctor {command}: the report is not JSON", p.returncode, p.stderr) from None
    return RunReport.from_dict(data, p.returncode, p.stderr)


def _probe(command: str):
    def call(script: str | os.PathLike | None = None, args: Sequence[str] = (), *, steps: int | None = None,
             timeout: float | None = None, module: str | None = None, out: str | os.PathLike | None = None,
             fail_on: str | None = None, options: Sequence[str] = (), cwd: str | os.PathLike | None = None,
             env: dict[str, str] | None = None) -> RunReport:
        target = ["-m", module] if module else []
        if script is not None:
            target.append(os.fspath(script))
        if not target:
            raise TypeError(f"{command}(): give a script path or module=")
        return run(command, *_options(steps, timeout, out, fail_on, options), *target, *[str(a) for a in args],
                   cwd=cwd, env=env)

    call.__name__ = call.__qualname__ = command
    call.__doc__ = (f"``torchdoctor {command} [OPTIONS] SCRIPT ARGS...`` in a child process (see "
                    f"``torchdoctor {command} --help``); ``options``: more CLI options before SCRIPT.")
    return call


checkup = _probe("checkup")
profile = _probe("profile")
memory = _probe("memory")
nan = _probe("nan")
compile = _probe("compile")  # noqa: A001 - the command's name
treat = _probe("treat")
repro = _probe("repro")
gradcheck = _probe("gradcheck")


def checkpoint_audit(path: str | os.PathLike, *, expect: str | None = None, options: Sequence[str] = (),
                     cwd: str | os.PathLike | None = None) -> RunReport:
    """``torchdoctor checkpoint-audit PATH`` (read safely, never unpickling code)."""
    opts = (["--expect", expect] if expect else []) + [str(o) for o in options]
    return run("checkpoint-audit", *opts, "--", os.fspath(path), cwd=cwd)


def env() -> RunReport:
    """``torchdoctor env``: the environment and hardware report."""
    return run("env")


def demo(steps: int | None = None) -> RunReport:
    """``torchdoctor demo``: a checkup of the bundled sick example."""
    return run("demo", *(["--steps", str(int(steps))] if steps is not None else []))


def compare(before: str | os.PathLike, after: str | os.PathLike) -> dict[str, Any]:
    """``torchdoctor compare BEFORE.json AFTER.json --json``: the comparison dict (docs/compare.md)."""
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "compare", "--json", os.fspath(before),
                        os.fspath(after)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       errors="replace")
    if p.returncode != 0 or not p.stdout.strip():
        raise TorchdoctorError(p.stderr.strip()[-1000:] or f"exit {p.returncode}", p.returncode, p.stderr)
    return json.loads(p.stdout)
