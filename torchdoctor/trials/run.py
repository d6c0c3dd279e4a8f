"""One bounded run under one variation, as the comparisons read it (:class:`TrialRun`): step
times by the one step-time basis, the synchronised window on CUDA, losses, peak memory, and why
the run cannot be compared (crash, timeout, no step). Made by :class:`~torchdoctor.trials.session.Trials`;
a ranked run (:mod:`torchdoctor.trials.ranked`) is one per rank, read together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection

from torchdoctor.evidence import Evidence
from torchdoctor.trials.spec import Variation


@dataclass
class TrialRun:
    """One bounded run under one variation, as the comparisons read it."""

    variation: Variation
    round: int
    evidence: Evidence
    wall_s: float

    def step_ms(self, exclude: Collection[int] = ()) -> list[float]:
        """Time of each judged step (warm-up left out), in ms, by the one step-time basis (on
        CUDA the longer of host wall and device span: ``evidence/steps.py``); ``exclude``: step
        numbers left out too (e.g. the steps in which torch.compile compiled)."""
        from torchdoctor.evidence.steps import judged_steps, step_seconds

        steps = [s for s in judged_steps(self.evidence) if int(s.get("step", 0)) not in exclude]
        return [t * 1e3 for t in step_seconds(self.evidence, steps)[0]]

    def window(self, exclude: Collection[int] = ()) -> dict[str, Any] | None:
        """The synchronised window of a CUDA trial run (``trial_window``: a synchronize at its
        start and end, so steps / window time is exact), when it holds no excluded step."""
        w = self.evidence.last("trial_window")
        if not w or not w.get("steps") or not w.get("wall_s"):
            return None
        from torchdoctor.evidence.steps import counted_steps

        lo, hi = int(w["from_step"]), int(w["to_step"])
        if any(lo <= int(s) <= hi for s in [*exclude, *counted_steps(self.evidence)]):
            return None
        return w

    def median_ms(self, exclude: Collection[int] = ()) -> float | None:
        """The run's step time: window wall / steps when a synchronised window was measured
        (CUDA), else the median of :meth:`step_ms`."""
        from torchdoctor.trials.compare import median

        w = self.window(exclude)
        if w is not None:
            return float(w["wall_s"]) / int(w["steps"]) * 1e3
        return median(self.step_ms(exclude))

    def time_basis(self, exclude: Collection[int] = ()) -> str:
        from torchdoctor.evidence.steps import judged_steps, step_seconds

        if self.window(exclude) is not None:
            return "synchronised window (steps / wall between two cuda synchronize)"
        return step_seconds(self.evidence, judged_steps(self.evidence)[:1])[1]

    def losses(self) -> list:
        """Per-step losses in step order (None: no backward that step; "nan"/"inf" strings)."""
        tr = self.evidence.last("loss_trace")
        if not tr:
            return []
        by_step = dict(zip(tr.get("steps", []), tr.get("losses", [])))
        n = max(by_step, default=0)
        return [by_step.get(s) for s in range(1, n + 1)]

    def peak_memory(self) -> tuple[int | None, str]:
        """(bytes, what): the CUDA allocator peak summed over devices, else the host peak RSS."""
        pk = self.evidence.last("peak_memory") or {}
        cuda = pk.get("cuda") or {}
        if cuda:
            return int(sum(cuda.values())), "cuda-allocated"
        rss = pk.get("host_rss")
        return (int(rss) if rss is not None else None), "host-rss"

    def peak_reserved(self) -> int | None:
        """The CUDA caching allocator's reserved peak summed over devices (None on CPU): what
        fragmentation and the allocator's configuration change."""
        res = (self.evidence.last("peak_memory") or {}).get("cuda_reserved") or {}
        return int(sum(res.values())) if res else None

    def interrupted(self) -> bool:
        """The run was stopped by Ctrl-C / SIGTERM / SIGHUP (forwarded to the child)."""
        res = self.evidence.result or {}
        return res.get("outcome") == "interrupted" or bool(res.get("interrupted"))

    def failure(self) -> str | None:
        """Why this run cannot be compared (crash, timeout, no step), or None."""
        res = self.evidence.result or {}
        outcome = res.get("outcome")
        if outcome == "crash":
            exc = res.get("exception") or {}
            uf = exc.get("user_frame") or {}
            where = f" at {uf.get('file')}:{uf.get('line')}" if uf else ""
            msg = str(exc.get("message", "")).strip().splitlines()
            return f"{exc.get('type', 'error')}: {msg[0] if msg else ''}{where}"[:500]
        if outcome == "timeout":
            return f"timed out after {res.get('timeout_s')} s"
        if outcome in ("signal", "interrupted"):
            return f"run ended by {res.get('signal') or res.get('interrupted_by') or outcome}"
        if outcome == "exit" and res.get("exit_code") not in (0, None):
            return f"the script exited with code {res.get('exit_code')}"
        if not self.evidence.of("step"):
            return "no training step was measured"
        return None
