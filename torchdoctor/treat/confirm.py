"""Findings that a trial confirmed carry the measured ratio (parent, pure).

An adopted trial of a treatment that cures a finding's cause (``confirms`` in the catalogue:
dataloader-workers → dataloader-bound, expandable-segments → memory-fragmentation, …) adds
``treat: {name: ratio}`` to that finding's evidence: the speed-up for a speed trial
(baseline / treated step time), the peak-memory ratio (before / after) for a memory trial, or
``"no OOM"`` when the treated run no longer ran out of memory.

A trial **measured** and found slower or within noise (verdict ``reject`` or ``noise`` on step
times, not a loss or memory rejection) is never offered as a fix: the parts of a finding's fix
text that carry its advice (``fix_words`` in the catalogue) are withdrawn, and the finding's
evidence says what the trial measured (``treat_not_a_fix: {name: reason}``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.treat.catalogue import BY_NAME


def ratio_of(entry: dict[str, Any]) -> float | str | None:
    t = BY_NAME.get(entry["name"])
    if t is not None and t.intent == "memory":
        b, a = entry.get("peak_memory_before"), entry.get("peak_memory_after")
        if b and a:
            return round(b / a, 2)
        return "no OOM"
    return entry.get("speedup")


def _measured_no_gain(e: dict[str, Any]) -> bool:
    """A trial whose treated runs trained and were timed, and that was not faster beyond noise."""
    return (e.get("verdict") in ("reject", "noise") and e.get("speedup") is not None
            and float(e["speedup"]) < 1 + float(e.get("noise_band") or 0.0))


def _without(fix: str, words: tuple[str, ...]) -> str:
    parts = [p for p in fix.split("; ") if not any(w.lower() in p.lower() for w in words)]
    return "; ".join(parts)


def withdraw_measured_fixes(report: Any, entries: list[dict[str, Any]]) -> None:
    for e in entries:
        t = BY_NAME.get(e["name"])
        if t is None or not t.fix_words or not _measured_no_gain(e):
            continue
        for i, f in enumerate(report.findings):
            kept = _without(f.fix or "", t.fix_words)
            if kept == (f.fix or ""):
                continue
            note = {**(f.evidence.get("treat_not_a_fix") or {}),
                    e["name"]: f"{float(e['speedup']):.2f}x, {e.get('reason')}"}
            report.findings[i] = dataclasses.replace(
                f, fix=kept, evidence={**f.evidence, "treat_not_a_fix": note})


def confirm_findings(report: Any, entries: list[dict[str, Any]]) -> None:
    withdraw_measured_fixes(report, entries)
    for i, f in enumerate(report.findings):
        got: dict[str, Any] = {}
        for e in entries:
            t = BY_NAME.get(e["name"])
            if e["verdict"] == "adopt" and t is not None and f.code in t.confirms:
                r = ratio_of(e)
                if r is not None:
                    got[e["name"]] = r
        if got:
            report.findings[i] = dataclasses.replace(f, evidence={**f.evidence, "treat": got})
