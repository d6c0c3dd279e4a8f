"""The finding-code catalog: each code declared exactly once.

A family module in this package (``env.py``, ``run.py``, ``perf.py`` ...) calls
:func:`declare` at import time for each code it owns. :func:`catalog` imports every
family module once and returns the codes by name. Declaring a code twice is an
error caught at import (and by ``tests/test_codes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdoctor.discovery import import_submodules
from torchdoctor.skills import ALL_SKILLS

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class CodeInfo:
    code: str
    skill: str
    severity: str  # default severity: "error" | "warning" | "info"
    summary: str  # one line: what the code means

    @property
    def docs(self) -> str:
        return f"docs/findings/{self.code}.md"


_CODES: dict[str, CodeInfo] = {}


def declare(code: str, skill: str, severity: str, summary: str) -> CodeInfo:
    """Register a finding code. Called at import of a family module."""
    if code in _CODES:
        raise ValueError(f"finding code declared twice: {code}")
    if skill not in ALL_SKILLS:
        raise ValueError(f"{code}: unknown skill {skill!r}")
    if severity not in SEVERITIES:
        raise ValueError(f"{code}: unknown severity {severity!r}")
    info = CodeInfo(code, skill, severity, summary)
    _CODES[code] = info
    return info


def catalog() -> dict[str, CodeInfo]:
    """All declared codes, importing every family module on first call."""
    import_submodules(__name__, __path__)
    return dict(_CODES)


def lookup(code: str) -> CodeInfo:
    """The declaration of ``code``; KeyError if unknown."""
    return catalog()[code]
