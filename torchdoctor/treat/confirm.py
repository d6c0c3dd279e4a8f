"""Findings that a trial confirmed carry the measured ratio (parent, pure).

An adopted trial of a treatment that cures a finding's cause (``confirms`` in the catalogue:
dataloader-workers → dataloader-bound, expandable-segments → memory-fragmentation, …) adds
``treat: {name: ratio}`` to that finding's evidence: the speed-up for a speed trial
(baseline / treated step time), the peak-memory ratio (before / after) for a memory trial, or
``"no OOM"`` when the treated run no longer ran out of memory.
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


def confirm_findings(report: Any, entries: list[dict[str, Any]]) -> None:
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
