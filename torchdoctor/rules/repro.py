"""unseeded-run: the seeding watch (``instruments/repro/seeding.py``) saw no seeding call of the global
RNGs in a run that made training steps."""

from __future__ import annotations

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import CHECKPOINTING

UNSEEDED_RUN = declare("unseeded-run", CHECKPOINTING, "info", "no RNG seeding seen")


@rule("unseeded-run", probes={"checkup"}, needs={"seeding", "step"}, raises=[UNSEEDED_RUN])
def unseeded_run(ev: Evidence) -> list[Finding]:
    summary = ev.last("seeding")
    if summary is None:
        raise NotApplicable("seeding calls were not instrumented in this run")
    if not ev.of("step"):
        raise NotApplicable("no training step was seen")
    if summary.get("calls"):
        return []
    return [finding(
        "unseeded-run",
        "no RNG seeding call was seen: weight init, shuffling and dropout differ on every run",
        {"watched": ["torch.manual_seed", "torch.cuda.manual_seed(_all)", "random.seed",
                     "numpy.random.seed", "numpy.random.default_rng(seed)"],
         "steps_seen": len(ev.of("step"))},
        fix="Seed once at start-up: torch.manual_seed(s); random.seed(s); numpy.random.seed(s) "
            "(and DataLoader(generator=torch.Generator().manual_seed(s)) for the shuffle order); "
            "save the seed with the checkpoint")]
