"""The finding catalogue: each code declared exactly once, in the rule module that raises it.

A rule module declares its codes at import time::

    DATA_SHARE = 0.30  # the loop waits on data for >= this share of the step
    DATALOADER_BOUND = declare("dataloader-bound", PERFORMANCE, "error",
                               "the loop waits on the next batch for >= 30% of step time",
                               thresholds={"DATA_SHARE": DATA_SHARE})

``thresholds`` names the module constants the rule compares against; the code's docs page
states each one as ```NAME` = value`` and ``tests/test_codes.py`` checks that the page and the
constants agree. Which probes judge a code is derived from the rules that raise it
(:func:`torchdoctor.judge.probes_of`), never written twice. :func:`catalog` imports every rule
module once, by discovery: the catalogue sits below the judge and the rules that declare into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from torchdoctor.skills import ALL_SKILLS

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class CodeInfo:
    code: str
    skill: str
    severity: str  # default severity: "error" | "warning" | "info"
    summary: str  # one line: what the code means
    thresholds: Mapping[str, float | int] = field(default_factory=dict)

    @property
    def docs(self) -> str:
        return f"docs/findings/{self.code}.md"


_CODES: dict[str, CodeInfo] = {}


def declare(code: str, skill: str, severity: str, summary: str,
            thresholds: Mapping[str, float | int] | None = None) -> CodeInfo:
    """Register a finding code. Called at import of the rule module that raises it."""
    if code in _CODES:
        raise ValueError(f"finding code declared twice: {code}")
    if skill not in ALL_SKILLS:
        raise ValueError(f"{code}: unknown skill {skill!r}")
    if severity not in SEVERITIES:
        raise ValueError(f"{code}: unknown severity {severity!r}")
    for name, value in (thresholds or {}).items():
        if not name.isupper() or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{code}: threshold {name}={value!r} must be an UPPER_CASE number")
    info = CodeInfo(code, skill, severity, summary, MappingProxyType(dict(thresholds or {})))
    _CODES[code] = info
    return info


def load_rules() -> None:
    """Import every rule module once (they declare their codes and register their rules)."""
    import torchdoctor.rules as pkg  # an empty package: the rule modules are discovered by name
    from torchdoctor.discovery import import_submodules

    import_submodules(pkg.__name__, pkg.__path__)


def catalog() -> dict[str, CodeInfo]:
    """All declared codes, importing every rule module on first call (torch is not imported)."""
    load_rules()
    return dict(_CODES)


def lookup(code: str) -> CodeInfo:
    """The declaration of ``code``; KeyError if unknown."""
    if code not in _CODES:
        catalog()
    return _CODES[code]

