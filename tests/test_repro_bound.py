"""The op tracer of ``repro``'s localising runs is bounded (issue 27 item 1).

On pytorch/examples' mnist_forward_forward the localising run (step 1, traced from start-up:
50,000 samples prepared one by one, ~850k tiny ops) grew to 20 GB in 65 s: torch's DebugMode
keeps a call object per op, and the op cap only applied when the trace was read at the end.
Now the first ``MAX_OPS`` ops are recorded, the rest are only counted (a ring of the last names),
the recording also stops once the process grew by ``TRACE_BUDGET_MB`` while tracing, and then
the run is ended at once. The end-to-end bound (the localising run's peak next to the plain
run's, on a forward-forward fixture of many small ops per step) is the last test.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

import torchdoctor.instruments.repro.fingerprint_ops as fops  # noqa: E402
from torchdoctor.instruments.testing import RecordingContext  # noqa: E402
from torchdoctor.reprocheck.ops import first_divergent_op, stop_note, trace_summary  # noqa: E402
from torchdoctor.runner.context import StopRun  # noqa: E402
from torchdoctor.torch_internals import debug_mode_class  # noqa: E402

ENGINES = ["dispatch"] + (["debug_mode"] if debug_mode_class() is not None else [])


def repro_ctx(engine: str) -> RecordingContext:
    """The context of ``repro``'s localising run: trace the ops of step 1 with ``engine``."""
    return RecordingContext("repro", {"repro_ops": {"step": 1, "engine": engine}})


def small_ops(n: int) -> torch.Tensor:
    """``n`` samples prepared one by one: a handful of tiny ops each."""
    y = torch.arange(n) % 10
    out = y.clone()
    for i, label in enumerate(y):
        out[i] = (label + 1) % 10
    return out


def trace(engine: str, n: int):
    inst, ctx = fops.FingerprintOps(), repro_ctx(engine)
    inst.install(ctx)
    box: dict = {}

    def work():
        try:
            box["out"] = small_ops(n)
        except StopRun as e:
            box["stopped"] = e

    try:
        work()
        box["dm_calls"] = len(inst.dm.operators) if inst.dm is not None else None
    finally:
        inst.uninstall(ctx)
    return box, ctx, [e for e in ctx.events if e["kind"] == "op_trace"][-1]


@pytest.mark.parametrize("engine", ENGINES)
def test_only_the_first_ops_are_kept_then_the_run_ends(engine, monkeypatch):
    monkeypatch.setattr(fops, "MAX_OPS", 200)
    box, ctx, ev = trace(engine, 400)
    assert isinstance(box.get("stopped"), StopRun) and ctx.stop_reason  # the run ended at the bound
    assert len(ev["ops"]) == 200 and ev["truncated"] and ev["seen"] == 201
    assert ev["stopped"]["reason"] == "ops" and ev["tail"]
    if box["dm_calls"] is not None:  # DebugMode's own list was cut too
        assert box["dm_calls"] <= 202
    assert "localisation stopped after the first 200 of 201 ops" in stop_note(ev)


@pytest.mark.parametrize("engine", ENGINES)
def test_growth_past_the_budget_stops_the_recording_with_a_note(engine, monkeypatch):
    monkeypatch.setattr(fops, "TRACE_BUDGET_MB", -1)  # any growth is too much
    monkeypatch.setattr(fops, "CHECK_EVERY", 50)
    _box, _ctx, ev = trace(engine, 100)
    assert ev["stopped"]["reason"] == "memory" and ev["stopped"]["at_op"] == 50
    assert len(ev["ops"]) == 49
    assert stop_note(ev).startswith("localisation stopped at ") and " MB " in stop_note(ev)
    assert trace_summary(ev)["note"] == stop_note(ev)


def test_an_op_outside_the_main_thread_is_never_stopped(monkeypatch):
    """Ops can run under the mode in another thread (autograd's device threads inherit it): the
    recording stops there too, but StopRun is raised in the main thread only."""
    monkeypatch.setattr(fops, "MAX_OPS", 100)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(zip(("res", "ctx", "ev"), trace("dispatch", 200))))
    t.start()
    t.join()
    assert "stopped" not in box["res"] and box["res"]["out"].tolist() == [(i % 10 + 1) % 10 for i in range(200)]
    ev = box["ev"]
    assert len(ev["ops"]) == 100 and ev["seen"] > 100 and ev["stopped"]["reason"] == "ops"


def test_cut_traces_are_compared_on_what_both_recorded_and_say_so():
    a = {"ops": [["aten::add", "other", 0, 0, [1.0, 1, 1], [2.0, 4, 2], ""]] * 3, "strings": [""],
         "truncated": True, "seen": 9000,
         "stopped": {"reason": "memory", "at_op": 3, "grown_mb": 530.4, "budget_mb": 512, "max_ops": 20000}}
    b = dict(a, ops=a["ops"][:2], stopped={**a["stopped"], "at_op": 2})
    op = first_divergent_op(a, b)
    assert op["kind"] == "unavailable"  # not "control-flow: one run ran more ops"
    assert op["reason"].startswith("localisation stopped at 530 MB") and "the 2 ops recorded agree" in op["reason"]
    b2 = dict(b, ops=[b["ops"][0], ["aten::add", "other", 0, 0, [1.0, 1, 1], [2.5, 4, 2], ""]])
    assert first_divergent_op(a, b2)["kind"] == "nondeterministic"  # a difference within is still found


def test_a_cut_trace_is_not_ruled_out_as_no_nondeterministic_op():
    from torchdoctor.evidence import Evidence
    from torchdoctor.rules.repro_runs import nondeterministic_run

    cmp = {"kind": "repro_compare", "compared": True, "identical": False, "first_divergent_step": 1,
           "diverged": {"step": 1, "what": "loss", "description": "loss"},
           "generators": {"implicated": [], "ruled_out": []},
           "first_divergent_op": {"kind": "unavailable", "reason": "localisation stopped at 530 MB"}}
    f = nondeterministic_run(Evidence.from_events([cmp]))[0]
    assert f.evidence["localised"] == "localisation stopped at 530 MB"
    assert not any("no op gave different outputs" in r for r in f.evidence["ruled_out"])


# the stated bound (docs/repro.md "Cost"): the localising run's peak resident memory exceeds the
# plain run's by at most this much, whatever the number of ops in the traced step
LOCALISE_EXTRA_MB = 200


@pytest.mark.slow
def test_a_step_of_many_small_ops_is_localised_within_the_stated_bound():
    """forward_forward_unseeded.py with 3,000 samples: ~49k ops in step 1 (traced from start-up).
    Before the bound the localising run peaked at 712 MB next to the plain run's 323 MB, growing
    with the ops (mnist_forward_forward: 20 GB); now the trace stops at 20,000 ops and the run
    ends there."""
    from pathlib import Path

    from torchdoctor.reprocheck.flow import RUN_A, localise_variation
    from torchdoctor.trials import Trials

    script = Path(__file__).resolve().parent / "fixtures" / "scripts" / "repro" / "forward_forward_unseeded.py"
    with Trials("repro", str(script), ["3000", "12"], options={"steps": 3, "timeout": 400}) as tr:
        plain = tr.run(RUN_A)
        loc = tr.run(localise_variation(1, "auto"), steps=1)
    trace = loc.evidence.last("op_trace")
    assert trace["stopped"]["reason"] == "ops" and len(trace["ops"]) == fops.MAX_OPS
    (p, _), (q, _) = plain.peak_memory(), loc.peak_memory()
    assert p and q and q - p <= LOCALISE_EXTRA_MB * 2**20, (p / 2**20, q / 2**20)
