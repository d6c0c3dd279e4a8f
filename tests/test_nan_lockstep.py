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

import json

import pytest

from test_nan_fixtures import SCRIPTS, run_inprocess

from torchdoctor.instruments.nan._nan_rows import RowReader
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


RANK_HARNESS = r"""
import json, os, runpy, sys, tempfile
from pathlib import Path
from torchdoctor.evidence import Evidence
from torchdoctor.numerics import hostread
from torchdoctor.pipeline.registry import armed_needs
from torchdoctor.runner.context import HarnessContext, StopRun
from torchdoctor.runner.core import Core
from torchdoctor.runner.harness import _armed
from torchdoctor.runner.rundir import META, EvidenceWriter, write_json
rank = int(os.environ["RANK"])
# the CUDA row path on CPU; rank 0's copies land at once, rank 1's a row late (a slower GPU)
if rank == 0:
    hostread.DeferredRowReader.ready = staticmethod(lambda h: True)
script = sys.argv[1]
opts = {"steps": 50, "nan_async_test": True}
d = Path(tempfile.mkdtemp())
write_json(d / META, {"probe": "nan", "argv": [script], "options": opts})
writer = EvidenceWriter(d)
ctx = HarnessContext("nan", d, opts, writer)
core = Core(ctx, _armed(sorted(armed_needs("nan"))))
core.install()
outcome = "exit"
try:
    sys.argv = [script]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")
except StopRun:
    outcome = "stopped"
finally:
    steps = ctx.step
    core.uninstall()
    writer.close()
ev = Evidence.load(d)
# one write of the whole line: two ranks share the pipe (print's text and newline could interleave)
sys.stdout.write("RESULT " + json.dumps({"rank": rank, "outcome": outcome, "steps": steps,
      "nonfinite": [(e["what"], e["step"], e.get("module")) for e in ev.of("nonfinite")],
      "errors": [e.get("traceback", "")[-300:] for e in ev.of("instrument_error")]}) + "\n")
sys.stdout.flush()
"""


@pytest.mark.slow
def test_two_gloo_ranks_on_the_cuda_row_path_stop_together_with_skewed_copy_timing(tmp_path):
    """The 4xH200 defect on 2 gloo ranks: the FSDP2 fixture (rank 1's forward makes NaN at step 3)
    on the device-row path, rank 0's row copies landing at once and rank 1's a row late. Before,
    rank 0 stopped at step 3 and rank 1 entered step 4's all_gather alone; now both read row 3 at
    step 4's optimizer pre-step and stop there, and rank 1 names its forward."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    harness = tmp_path / "harness.py"
    harness.write_text(RANK_HARNESS)
    script = SCRIPTS / "dist" / "fsdp2_nan.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # before the fix rank 0 stopped at step 3 and rank 1 died on "Connection closed by peer"
    # (gloo; NCCL hangs instead): its own session, so a hang leaves no process behind
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(harness), str(script)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    # each rank's result, even if two lines met on the shared pipe ("{...}RESULT {...}", seen in CI)
    dec = json.JSONDecoder()
    got = sorted((dec.raw_decode(chunk.lstrip())[0] for chunk in out.split("RESULT ")[1:]),
                 key=lambda x: x["rank"])
    assert p.returncode == 0 and len(got) == 2, (out[-2000:], err[-3000:])
    assert [(x["outcome"], x["steps"]) for x in got] == [("stopped", 4), ("stopped", 4)], got
    assert got[1]["nonfinite"] == [["forward", 3, "model.blocks.0.attn"]], got
    assert [(w, s) for w, s, _m in got[0]["nonfinite"]] == [("gradient", 3)], got
    assert got[0]["errors"] == got[1]["errors"] == [], got
