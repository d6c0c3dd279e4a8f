"""The one rule contract and the one guarded judge, for every family of findings.

A rule is a pure function of one probe's evidence (no I/O, no torch, no printing) that returns
the findings it raises (an empty list: judged healthy) or raises :class:`NotApplicable` with the
reason it cannot judge (reported in the JSON ``skipped`` list: not applicable is not healthy)::

    @rule("dataloader-bound", probes={"profile", "checkup"}, needs={"step"},
          raises=[DATALOADER_BOUND])
    def dataloader_bound(ev: Evidence) -> list[Finding]:
        ...

``probes`` names the commands whose evidence the rule judges: the script probes (``run``,
``checkup``, ``profile``, ``memory``, ``nan``, ``dist`` — a script under torchrun; ``ranks``
for the cross-rank view of a ranked run) read :class:`torchdoctor.evidence.Evidence`;
``checkpoint-audit`` reads the checkpoint evidence, ``env`` the environment facts,
``dist-env`` and ``dist-selftest`` the launch facts and the collective self-test of
``torchdoctor dist`` (``distributed/evidence.py``). ``needs`` lists the evidence kinds the rule reads (for the script probes:
event kinds; instruments declare what they produce and the runner arms what the probe's rules
need). ``raises`` lists the :class:`~torchdoctor.catalog.CodeInfo` it may raise.

:func:`judge` applies every rule of a probe, in name order, each guarded: a rule that crashes
becomes an ``internal-error`` finding (its traceback, made printable, as evidence) and the
rest of the report stands. Rule modules live in ``torchdoctor/rules/`` and are discovered.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from torchdoctor.catalog import CodeInfo, load_rules
from torchdoctor.findings import Finding, Report, internal_finding
from torchdoctor.safe import visible


class NotApplicable(Exception):
    """The rule cannot judge this evidence; the message says why (e.g. "needs CUDA")."""


@dataclass(frozen=True)
class Rule:
    name: str
    probes: frozenset[str]
    needs: frozenset[str]
    raises: frozenset[str]  # codes
    fn: Callable[[Any], list[Finding]]


_RULES: dict[str, Rule] = {}


def rule(name: str, *, probes: Iterable[str], needs: Iterable[str] = (),
         raises: Iterable[CodeInfo | str] = ()):
    """Register ``fn(evidence) -> list[Finding]`` as rule ``name`` (unique across families)."""
    codes = frozenset(c.code if isinstance(c, CodeInfo) else str(c) for c in raises)
    probe_set = frozenset(probes)
    if not probe_set:
        raise ValueError(f"rule {name}: no probes")

    def deco(fn):
        if name in _RULES and _RULES[name].fn is not fn:
            raise ValueError(f"rule registered twice: {name}")
        _RULES[name] = Rule(name, probe_set, frozenset(needs), codes, fn)
        return fn

    return deco


def all_rules() -> dict[str, Rule]:
    load_rules()  # the catalogue's discovery of the rule modules (re-exported here)
    return dict(_RULES)


def probes_of(code: str) -> frozenset[str]:
    """The probes whose rules raise ``code`` (derived from the rules' ``raises``)."""
    out: set[str] = set()
    for r in all_rules().values():
        if code in r.raises:
            out |= r.probes
    return frozenset(out)


def rules_for(probe: str) -> list[Rule]:
    return sorted((r for r in all_rules().values() if probe in r.probes), key=lambda r: r.name)


def needs_of(probe: str) -> frozenset[str]:
    """Every evidence kind the rules of ``probe`` read."""
    out: set[str] = set()
    for r in rules_for(probe):
        out |= r.needs
    return frozenset(out)


def apply(r: Rule, evidence: Any) -> tuple[list[Finding], str | None]:
    """(findings, skip reason) of one rule, guarded: a crash is one ``internal-error`` finding
    (the rule's partial output is dropped: it is not evidence)."""
    try:
        return list(r.fn(evidence) or []), None
    except NotApplicable as na:
        return [], str(na) or "not applicable"
    except Exception as e:  # noqa: BLE001 - a broken rule must not hide the others
        return [crash_finding(r.name, e)], None


def crash_finding(name: str, e: BaseException) -> Finding:
    msg = "recursion too deep" if isinstance(e, RecursionError) else str(e)
    tb = traceback.format_exception(type(e), e, e.__traceback__, limit=-6)
    return internal_finding(f"rule {name} failed: {type(e).__name__}: {visible(msg)[:300]}",
                            {"rule": name, "traceback": visible("".join(tb))[-4000:]})


def judge(probe: str, evidence: Any, report: Report, only: set[str] | None = None) -> None:
    """Apply every rule of ``probe`` to ``evidence``, adding findings and skips to ``report``."""
    for r in rules_for(probe):
        if only is not None and r.name not in only:
            continue
        found, skipped = apply(r, evidence)
        for f in found:
            report.add(f)
        if skipped is not None:
            report.skip(r.name, skipped)
