"""A trial run on N ranks (``treat --nproc-per-node N``): one torchrun launch of every rank.

:class:`RankedTrialRun` reads like a :class:`~torchdoctor.trials.session.TrialRun` (the
comparisons need not know), built from one ``TrialRun`` per rank dir:

* **step time**: the **slowest rank's** — each rank's run step time (its median judged step, or
  its synchronised window on CUDA), the largest of them: under data parallelism every rank waits
  for the slowest at each gradient reduction, so the job runs at that rank's pace;
* **losses**: per rank (:meth:`rank_losses`: each rank trains on its own shard of the data, so a
  treated rank is compared with the same rank of the baseline); :meth:`losses` is rank 0's;
* **peak memory**: the largest rank's;
* **failure**: the rank that failed first and its error (``rank 1: RuntimeError: … at
  train.py:31``), a timeout of the launch, or a rank that never started;
* ``evidence``: rank 0's (the survey, the treatment's notes and changes); ``per``: every rank's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from torchdoctor.evidence import Evidence
from torchdoctor.trials.run import TrialRun
from torchdoctor.trials.spec import Variation


@dataclass
class RankedTrialRun(TrialRun):
    per: dict[int, TrialRun] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)  # the launch's merged result
    run_dir: Path | None = None
    nproc: int = 0
    merged: Evidence | None = None  # the cross-rank evidence (the ranked report's cross-rank rules)

    @property
    def ranks(self) -> dict[int, TrialRun]:
        """Each rank's own run (the resume check compares them rank by rank)."""
        return self.per

    # ---- time ----------------------------------------------------------------------------
    def rank_ms(self, exclude: Collection[int] = ()) -> dict[int, float]:
        out = {}
        for r, t in sorted(self.per.items()):
            ms = t.median_ms(exclude)
            if ms is not None:
                out[r] = ms
        return out

    def slowest_rank(self, exclude: Collection[int] = ()) -> int | None:
        ms = self.rank_ms(exclude)
        return max(ms, key=lambda r: (ms[r], -r)) if ms else None

    def median_ms(self, exclude: Collection[int] = ()) -> float | None:
        r = self.slowest_rank(exclude)
        return None if r is None else self.rank_ms(exclude)[r]

    def step_ms(self, exclude: Collection[int] = ()) -> list[float]:
        r = self.slowest_rank(exclude)
        return [] if r is None else self.per[r].step_ms(exclude)

    def window(self, exclude: Collection[int] = ()) -> dict[str, Any] | None:
        r = self.slowest_rank(exclude)
        return None if r is None else self.per[r].window(exclude)

    def time_basis(self, exclude: Collection[int] = ()) -> str:
        r = self.slowest_rank(exclude)
        base = self.per[r].time_basis(exclude) if r is not None else "no step"
        return f"{base}, the slowest of {self.nproc} ranks"

    # ---- losses and memory ---------------------------------------------------------------
    def rank_losses(self) -> dict[int, list]:
        return {r: t.losses() for r, t in sorted(self.per.items())}

    def losses(self) -> list:
        return self.per[min(self.per)].losses() if self.per else []

    def peak_memory(self) -> tuple[int | None, str]:
        peaks = [t.peak_memory() for t in self.per.values()]
        got = [p for p in peaks if p[0] is not None]
        if not got:
            return None, peaks[0][1] if peaks else "host-rss"
        return max(got)

    def peak_reserved(self) -> int | None:
        got = [v for v in (t.peak_reserved() for t in self.per.values()) if v is not None]
        return max(got) if got else None

    # ---- outcome -------------------------------------------------------------------------
    def interrupted(self) -> bool:
        return self.result.get("outcome") == "interrupted" or bool(self.result.get("interrupted"))

    def failure(self) -> str | None:
        res = self.result
        if res.get("outcome") == "timeout":
            return f"timed out after {res.get('timeout_s')} s (all {self.nproc} ranks stopped)"
        fails = {r: f for r, f in ((r, t.failure()) for r, t in sorted(self.per.items())) if f}
        first = res.get("failed_rank")
        if first not in fails:  # not named by the launch: a rank that failed on its own first
            own = [r for r in fails if not self._stopped(r)]
            first = (own or list(fails) or [None])[0]
        if first is not None:
            return f"rank {first}: {fails[first]}"
        missing = [r for r in range(self.nproc) if r not in self.per]
        if missing:
            return f"rank {missing[0]} did not start ({res.get('outcome') or 'no result'})"
        return None

    def _stopped(self, r: int) -> bool:
        return bool((self.per[r].evidence.result or {}).get("stopped_by_launcher"))

    def rank_evidence(self) -> list[tuple[int, Evidence]]:
        return [(r, t.evidence) for r, t in sorted(self.per.items())]


def load_ranked(variation: Variation, round: int, run_dir: Path, nproc: int,
                wall_s: float) -> RankedTrialRun:
    """The ranked run of ``run_dir`` (its ``rank{R}`` dirs) as one trial run."""
    from torchdoctor.distributed.rankdir import rank_dir
    from torchdoctor.runner.rundir import RESULT, read_json

    per: dict[int, TrialRun] = {}
    for r in range(nproc):
        d = rank_dir(run_dir, r)
        if d.is_dir():
            per[r] = TrialRun(variation, round, Evidence.load(d), wall_s)
    from torchdoctor.evidence.ranks import merged_evidence
    from torchdoctor.runner.rundir import META

    first = per[min(per)].evidence if per else Evidence()
    _per, merged = merged_evidence(run_dir, nproc)
    merged.meta["started"] = (read_json(Path(run_dir) / META) or {}).get("started")
    return RankedTrialRun(variation, round, first, wall_s, per=per,
                          result=read_json(Path(run_dir) / RESULT) or {}, run_dir=Path(run_dir),
                          nproc=nproc, merged=merged)
