"""The report model: Finding, Report, severities, exit codes, JSON (schema 1).

Rendering lives in ``torchdoctor.report``; this module only holds data. A
``Report`` is what every command produces; console and JSON render the same object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchdoctor.version import __version__
from torchdoctor.catalog import CodeInfo, lookup
from torchdoctor.errors import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK

SCHEMA = 1
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
MARKS = {"error": "✗", "warning": "!", "info": "•"}
STATUSES = ("ok", "findings", "crashed", "timeout", "interrupted", "error")


@dataclass(frozen=True)
class Finding:
    code: str
    skill: str
    severity: str
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    docs: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "skill": self.skill,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "docs": self.docs,
        }


def finding(code: CodeInfo | str, title: str, evidence: dict[str, Any] | None = None, fix: str = "",
            severity: str | None = None, skill: str | None = None) -> Finding:
    """Build a Finding for a declared code (its :class:`CodeInfo`, or its name, looked up in the
    catalogue); skill, severity and docs come from the declaration."""
    info = code if isinstance(code, CodeInfo) else lookup(code)
    return Finding(
        code=info.code,
        skill=skill or info.skill,
        severity=severity or info.severity,
        title=title,
        evidence=dict(evidence or {}),
        fix=fix,
        docs=info.docs,
    )


def internal_finding(title: str, evidence: dict[str, Any] | None = None) -> Finding:
    """A probe, rule or provider of torchdoctor itself failed: reported, not hidden."""
    return finding("internal-error", title, evidence,
                   fix="This is a torchdoctor bug; please report it with this evidence. "
                       "The rest of the report still stands.")


@dataclass
class Skipped:
    rule: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason}


@dataclass
class Report:
    """What a command found. ``status`` is derived unless set (crashed/timeout/error)."""

    command: str
    target: str | None = None
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # header: device, torch, python
    # "crashed" | "timeout" | "interrupted" | "error" when the run itself says so
    run_status: str | None = None

    def add(self, f: Finding) -> None:
        self.findings.append(f)

    def skip(self, rule: str, reason: str) -> None:
        self.skipped.append(Skipped(rule, reason))

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: SEVERITY_RANK.get(f.severity, 9))

    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0, "info": 0}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out

    @property
    def status(self) -> str:
        if self.run_status:
            return self.run_status
        return "findings" if self.findings else "ok"

    def exit_code(self, fail_on: str = "error") -> int:
        """0 ok, 1 an error finding (or a warning with fail_on='warning'), 3 internal failure,
        130 the run was interrupted (Ctrl-C, SIGTERM, SIGHUP): its report is partial."""
        if self.run_status == "error":
            return EXIT_INTERNAL
        if self.run_status == "interrupted":
            return EXIT_INTERRUPTED
        c = self.counts()
        if c["error"] or (fail_on == "warning" and c["warning"]):
            return EXIT_FINDINGS
        return EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "torchdoctor",
            "version": __version__,
            "schema": SCHEMA,
            "command": self.command,
            "target": self.target,
            "status": self.status,
            "findings": [f.to_dict() for f in self.sorted_findings()],
            "skipped": [s.to_dict() for s in self.skipped],
            "metrics": self.metrics,
            "artifacts": self.artifacts,
            "context": self.context,
        }
