"""Order of routes: cross-cutting sequences and the routing table's precedence rules, as data.

Routes are first ranked by what put them there (a recognised error text, then an observed symptom,
then a topic, then mere context), then by weight and by where the words appear. ``PRECEDENCE`` then
moves skills that must come first (diagnosis before solutions, setup before optimisation, structure
before customisation) ahead, by a stable topological sort. The rules form no cycle (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdoctor.triage.symptoms import AG, CKPT, DBG, DIST, MEM, MOD, MP, PERF

TIERS = {"error": 0, "symptom": 1, "topic": 2, "context": 3}


@dataclass(frozen=True)
class Precedence:
    first: str
    then: str
    why: str
    labels: tuple[str, ...] = ()  # applies only when one of these signal labels matched
    unless_symptom_of: str | None = None  # does not apply when this skill has a symptom of its own
    unless_error_of: str | None = None  # does not apply when a recognised error text routes to this skill


PRECEDENCE: tuple[Precedence, ...] = (
    Precedence(DIST, MEM, "OOM in a distributed run: check the distributed setup first (sharding, per-rank "
               "batch, device placement), then per-GPU memory"),
    Precedence(DBG, MP, "NaN with AMP: find where the non-finite value starts first, then fix the "
               "mixed-precision setup"),
    Precedence(MOD, PERF, "a slow custom layer: the design may be inefficient; structure first, then profile",
               labels=("custom layer",)),
    Precedence(MOD, AG, "structure before customisation: the module first, then its custom backward"),
    Precedence(PERF, MP, "diagnosis before solutions: profile before turning on mixed precision"),
    Precedence(PERF, DIST, "profile first; scale out once one GPU is used well", unless_symptom_of=DIST),
    Precedence(CKPT, MOD, "saving a model is a checkpointing question, not module design"),
    Precedence(CKPT, DBG, "trouble right after resuming: check what the checkpoint restored first",
               labels=("resume training",)),
    Precedence(DBG, AG, "diagnose where the non-finite gradient appears, then fix the custom Function",
               unless_error_of=AG),
    Precedence(MEM, MP, "measure the memory breakdown first; mixed precision is one of the fixes"),
    Precedence(DBG, MOD, "diagnose first, then change the design", unless_error_of=MOD),
)


def order_skills(ranked: list[str], labels: set[str], symptom_skills: set[str],
                 error_skills: set[str] = frozenset()) -> tuple[list[str], dict]:
    """Stable topological sort of ``ranked`` under the applicable precedence rules.

    Returns the order and, per skill, the rules that placed another skill before it
    (``{skill: [Precedence, ...]}``) for the why.
    """
    present = set(ranked)
    active = [p for p in PRECEDENCE
              if p.first in present and p.then in present
              and (not p.labels or labels.intersection(p.labels))
              and not (p.unless_symptom_of and p.unless_symptom_of in symptom_skills)
              and not (p.unless_error_of and p.unless_error_of in error_skills)]
    before: dict[str, list[Precedence]] = {s: [p for p in active if p.then == s] for s in ranked}
    out: list[str] = []
    left = list(ranked)
    while left:
        for s in left:
            if all(p.first in out for p in before[s]):
                out.append(s)
                left.remove(s)
                break
        else:  # a cycle among active rules: cannot happen (tested); keep the rank order
            out.extend(left)
            break
    return out, {s: rules for s, rules in before.items() if rules}
