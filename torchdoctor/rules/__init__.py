"""Rules: pure functions from Evidence to Findings (judgment; no measuring, no printing).

Register with :func:`rule`::

    @rule("dataloader-bound", probes={"profile", "checkup"})
    def dataloader_bound(ev: Evidence) -> list[Finding]:
        waits = ev.of("step")
        if not waits:
            raise NotApplicable("no training step was seen")
        ...

A rule returns the findings it raises (an empty list means judged healthy) or raises
:class:`NotApplicable` (reported in the JSON ``skipped`` list: not applicable is not healthy).
Modules in this package are discovered automatically. ``run_rules`` turns a rule that
crashes into an ``internal-error`` finding so the rest of the report still prints.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Callable

from torchdoctor.discovery import import_submodules
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, Report, internal_finding


class NotApplicable(Exception):
    """The rule cannot judge this run; the message says why (e.g. "needs CUDA")."""


@dataclass(frozen=True)
class Rule:
    name: str
    probes: frozenset[str]
    fn: Callable[[Evidence], list[Finding]]


_RULES: dict[str, Rule] = {}


def rule(name: str, probes: set[str] | frozenset[str]):
    def deco(fn):
        if name in _RULES:
            raise ValueError(f"rule registered twice: {name}")
        _RULES[name] = Rule(name, frozenset(probes), fn)
        return fn

    return deco


def all_rules() -> dict[str, Rule]:
    import_submodules(__name__, __path__)
    return dict(_RULES)


def rules_for(probe: str) -> list[Rule]:
    return [r for r in all_rules().values() if probe in r.probes]


def run_rules(probe: str, ev: Evidence, report: Report, only: set[str] | None = None) -> None:
    """Apply every rule of ``probe`` to ``ev``, adding findings/skips to ``report``."""
    for r in sorted(rules_for(probe), key=lambda r: r.name):
        if only is not None and r.name not in only:
            continue
        try:
            for f in r.fn(ev) or []:
                report.add(f)
        except NotApplicable as na:
            report.skip(r.name, str(na) or "not applicable")
        except Exception as e:  # noqa: BLE001 - a broken rule must not hide the others
            report.add(internal_finding(
                f"rule {r.name} failed: {type(e).__name__}: {e}",
                {"rule": r.name, "traceback": traceback.format_exc(limit=6)}))
