"""Shared helpers of the cross-rank rules (probe ``"ranks"``): the ranks' results, stacks and
outcomes in words, and the lines of their errors that the error-text table recognises.

The rules judge the merged Evidence of :mod:`torchdoctor.evidence.ranks` (every event carries
its ``rank``): ``ranks_collectives`` (collective-hang, collective-mismatch), ``ranks_samplers``
(missing-distributed-sampler, sampler-epoch-not-set), ``ranks_stragglers`` (rank-straggler).
This module registers no rule.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.distributed.failtext import COLLECTIVE_FAILURE, own_crash
from torchdoctor.errortext.match import matches
from torchdoctor.errortext.table import Known
from torchdoctor.evidence import Evidence

def world_of(ev: Evidence) -> int:
    return int(ev.meta.get("world_size") or 0)


def rank_results(ev: Evidence) -> dict[int, dict[str, Any]]:
    return {int(e["rank"]): e for e in ev.of("rank_result")}


def rank_stacks(ev: Evidence) -> dict[int, dict[str, Any]]:
    return {int(e["rank"]): e for e in ev.of("rank_stacks")}


def rname(r: int) -> str:
    return f"rank {r}"


def failure_lines(ev: Evidence, among: tuple[Known, ...] = COLLECTIVE_FAILURE) -> list[str]:
    """Lines of the ranks' exceptions and of the run's output that a row of ``among`` matches."""
    out: list[str] = []
    for r, res in sorted(rank_results(ev).items()):
        msg = (res.get("exception") or {}).get("message") or ""
        for ln in msg.splitlines():
            if ln.strip() and matches(ln, among):
                out.append(f"rank {r}: {ln.strip()[:300]}")
                break
    for ln in ev.result.get("output_tail") or []:
        if matches(ln, among) and not ln.lstrip().startswith(("File ", "raise ", "return ")):
            t = ln.strip()[:300]
            if t and t not in out:
                out.append(t)
    return out[:6]


def crashed_ranks(ev: Evidence) -> list[int]:
    """Ranks that raised in their own code (not a collective failure caused by another rank)."""
    return [r for r, res in sorted(rank_results(ev).items()) if own_crash(res)]


def rank_outcomes(ev: Evidence) -> dict[str, str]:
    """'rank R' -> how it ended, in words (for the evidence of a cross-rank finding)."""
    out = {}
    for r, res in sorted(rank_results(ev).items()):
        o = res.get("outcome")
        if res.get("stopped_by_launcher"):
            text = f"stopped by torchrun ({res.get('signal')}) after another rank failed"
        elif o == "crash":
            exc = res.get("exception") or {}
            first = next((ln for ln in (exc.get("message") or "").splitlines() if ln.strip()), "")
            text = f"raised {exc.get('type')}: {first[:200]}"
        elif o == "signal":
            text = f"died by {res.get('signal')}"
        elif o == "timeout":
            text = "still running at the timeout (killed)"
        elif o in ("exit", "stopped"):
            text = f"{'stopped at --steps' if o == 'stopped' else 'exited'} (code " \
                   f"{res.get('exit_code', 0)}) after {res.get('steps', 0)} steps"
        else:
            text = str(o)
        out[rname(r)] = text
    return out



def step_words(step: int) -> str:
    """When a call was made, by the optimizer steps completed (the recorder's ``step``)."""
    if step <= 0:
        return "before the first optimizer step"
    return f"after {step} optimizer step{'s' if step != 1 else ''}"

