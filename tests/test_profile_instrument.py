"""The profiler-window instrument driven by a tiny in-process CPU loop with the recording context."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.pipeline.registry import instruments_for  # noqa: E402
from torchdoctor.instruments.profile._profiler_compat import quiet_kineto  # noqa: E402
from torchdoctor.instruments.profile.profiler_window import ProfilerWindow, make_sources  # noqa: E402
from torchdoctor.instruments.testing import RecordingContext  # noqa: E402


def profile_ctx(tmp_path: Path, options: dict, out: bool = False) -> RecordingContext:
    """The harness context of a ``profile`` run in ``tmp_path/run`` (``--out tmp_path/out``)."""
    return RecordingContext("profile", options, tmp_path / "run",
                            tmp_path / "out" if out else None)


def run_window(ctx, n_steps, batch=None):
    """A tiny SGD loop under a ProfilerWindow driven by ``ctx``; ``batch(step)`` makes each
    step's input (default: an 8x16 random batch). Returns the uninstalled instrument."""
    torch.manual_seed(0)
    inst = ProfilerWindow()
    inst.install(ctx)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(1, n_steps + 1):
            x = batch(step) if batch is not None else torch.randn(8, 16)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            inst.on_step_end(ctx, step)
    finally:
        inst.uninstall(ctx)
    return inst


def test_registered_for_the_profile_probe_only():
    assert ProfilerWindow in instruments_for("profile")
    assert ProfilerWindow not in instruments_for("checkup")


def test_window_is_analysed_into_compact_events_and_the_trace_kept(tmp_path):
    ctx = profile_ctx(tmp_path, {"steps": 8, "profile_skip": 2, "profile_active": 2}, out=True)
    run_window(ctx, 8)
    (w,) = ctx.of("profile_window")
    assert w["status"] == "ok" and w["steps"] == [4, 5] and w["first_step"] == 4
    assert w["cuda"] in (True, False)
    for kind in ("profile_ops", "profile_host", "profile_python"):
        assert len(ctx.of(kind)) == 1, kind
    ops = {r["name"] for r in ctx.of("profile_ops")[0]["by_self_cpu"]}
    assert {"aten::addmm", "aten::mm"} & ops
    assert not ctx.of("profile_device")  # no GPU work in this loop
    trace = Path(w["trace"])
    assert trace.parent == ctx.out_dir and trace.stat().st_size > 1000
    assert ctx.of("artifact") == [{"kind": "artifact", "name": "trace", "path": str(trace)}]
    assert len(json.dumps(ctx.events)) < 20_000  # never the raw profile


def test_a_run_shorter_than_the_window_says_so(tmp_path):
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 5})
    run_window(ctx, 3)
    (w,) = ctx.of("profile_window")
    assert w["status"] == "not-reached" and w["steps_seen"] == 3 and w["steps_needed"] == 9


def test_a_run_that_ends_inside_the_window_is_analysed_as_partial(tmp_path):
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 1, "profile_active": 4})
    run_window(ctx, 4)
    (w,) = ctx.of("profile_window")
    assert w["status"] == "partial" and w["active_steps"] >= 1
    # the last range ran from step 4's end to the stop at teardown: not a step (4xH200 fsdp_tp_2d.py)
    assert w["open_step_dropped"] and w["steps"][-1] == 4, w["steps"]


def test_quiet_kineto_drops_only_kineto_lines(capfd):
    with quiet_kineto():
        os.write(2, b"STAGE:2026-11-26 04:08:18 7220:7220 ActivityProfilerController.cpp:312] Completed\n")
        os.write(2, b"USDT:2026-11-26 04:08:18 7220:7220 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"the script's own line\n")
        print("python stderr line", file=sys.stderr)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "ActivityProfilerController" not in err
    assert "the script's own line" in err and "python stderr line" in err


def test_sources_tell_user_files_from_libraries(tmp_path):
    script = tmp_path / "train_me.py"
    script.write_text("x = 1\ny = 2\n")
    src = make_sources((str(tmp_path),))
    assert src.is_user("train_me.py")
    assert src.code("train_me.py", 2) == "y = 2"
    assert not src.is_user("torch/nn/modules/module.py")
    assert not src.is_user("<frozen os>")
    assert src.is_tool("torchdoctor/runner/core.py")
