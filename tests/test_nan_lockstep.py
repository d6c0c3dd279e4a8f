"""Several ranks read the monitor's device rows at the same point, whatever their GPU timing.

The defect (4xH200, NCCL, fixture dist/fsdp2_nan.py): a CUDA row is read once its copy's event
has completed (``Event.query``), a per-rank timing. Rank 0's copy of step 3's row had landed at
its step-3 optimizer pre-step, so it read the NaN gradient norm there and stopped; rank 1's had
not, so it went on into step 4's all_gather, which rank 0 never entered: a hang to the 180 s
timeout, and rank 1's nonfinite-forward (the real finding) was never written. On gloo the rows
are read at once, so the CPU fixture passed.

Here the CUDA read path runs on CPU (option ``nan_async_test``) as one rank of several
(``_lockstep`` forced on), once with a reader whose copies land at once (the fast rank) and once
with one whose copies never land by themselves (the slow rank): both must find the same row at
the same step and stop at the same step boundary.
"""
from __future__ import annotations

import pytest

from test_nan_fixtures import SCRIPTS, run_inprocess

from torchdoctor.instruments._nan_rows import RowReader
from torchdoctor.numerics import hostread


def _run(monkeypatch, landed: bool, lockstep: bool = True):
    monkeypatch.setattr(RowReader, "_lockstep", lambda self: lockstep)
    monkeypatch.setattr(hostread.DeferredRowReader, "ready", staticmethod(lambda h: landed))
    ev = run_inprocess("nan", SCRIPTS / "nan/forward_div.py", options={"nan_async_test": True})
    [bad] = ev.of("nonfinite")
    return bad["what"], bad["step"], ev.result


@pytest.mark.parametrize("landed", [True, False], ids=["fast-rank", "slow-rank"])
def test_ranks_read_a_device_row_at_its_successors_close_whatever_the_timing(monkeypatch, landed):
    what, step, result = _run(monkeypatch, landed)
    assert (what, step) == ("forward", 6)
    # row 6 is read at row 7's close (step 7's optimizer pre-step) on every rank: all stop there
    assert (result["outcome"], result["steps"]) == ("stopped", 7), result


def test_one_process_keeps_reading_rows_as_they_land(monkeypatch):
    """Without a process group of several ranks nothing waits: a landed row is read at once."""
    what, step, result = _run(monkeypatch, True, lockstep=False)
    assert (what, step, result["outcome"], result["steps"]) == ("forward", 6, "stopped", 6)
