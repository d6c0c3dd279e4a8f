"""N5 (issue 13): the profiler window's cost is bounded before it is paid.

A step that makes tens of thousands of Python calls (a Dataset decoding per pixel in Python, as
PIL-based pipelines do) made the 3-step window a 20-33 MB trace and ~1 s of flattening. The
window now counts the Python calls of the last waiting step and records only as many steps as
fit the budget (Python stacks off above 4 budgets), stops early when recorded steps cost far
more than plain ones, and does not keep leaf C calls.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.instruments.profile import profiler_window as pw  # noqa: E402
from torchdoctor.instruments.profile.profiler_window import ProfilerWindow, plan_budget  # noqa: E402

from fixture_runs import run_fixture  # noqa: E402
from test_profile_instrument import profile_ctx, run_window  # noqa: E402


def test_plan_keeps_the_window_when_it_fits():
    assert plan_budget(1000, 3, budget=40_000) == {"active": 3, "with_stack": True, "budget": 40_000,
                                                  "py_calls_per_step": 1000}
    assert plan_budget(None, 3)["active"] == 3  # not counted: left as planned


def test_plan_cuts_active_steps_then_python_stacks():
    p = plan_budget(20_000, 3, budget=40_000)
    assert p["active"] == 2 and p["with_stack"] and "2 active" in p["reason"]
    p = plan_budget(60_000, 3, budget=40_000)
    assert p["active"] == 1 and p["with_stack"]
    p = plan_budget(200_000, 3, budget=40_000)
    assert p["active"] == 1 and not p["with_stack"] and "without Python stacks" in p["reason"]


def _pixel(i, j):
    return (i * 31 + j) % 255


def _decode(i):
    return [min(1, max(0, _pixel(i, j) / 255)) for j in range(600)]


def _heavy_batch(step):
    rows = [_decode(step * 8 + k)[:16] for k in range(8)]  # ~10k Python calls
    return torch.tensor(rows, dtype=torch.float32)


def test_a_python_heavy_step_gets_a_shorter_window(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "PY_EVENT_BUDGET", 12_000)
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 3, "profile_active": 3})
    run_window(ctx, 10, _heavy_batch)
    (w,) = ctx.of("profile_window")
    b = w["budget"]
    assert 8_000 < b["py_calls_per_step"] < 20_000, b  # _decode: 8 x 1200 calls + the loop's own
    assert w["status"] == "ok" and w["active"] == 1 and w["active_steps"] == 1 and w["steps"] == [5]
    assert ctx.of("profile_python")[0]["functions"]  # stacks still on: hotspots listed


def test_a_very_heavy_step_is_recorded_without_python_stacks(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "PY_EVENT_BUDGET", 1_000)
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 3, "profile_active": 3, "profile_dump_flat": 1})
    run_window(ctx, 10, _heavy_batch)
    (w,) = ctx.of("profile_window")
    assert w["budget"]["with_stack"] is False and w["active_steps"] == 1
    assert ctx.of("profile_ops")[0]["by_self_cpu"]  # the torch-op view stays
    import gzip

    flat = json.load(gzip.open(ctx.run_dir / "profile_flat.json.gz", "rt"))
    assert not [n for n in flat["nodes"] if n[2] == "py"]


def test_a_light_step_keeps_the_full_window(tmp_path):
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 3, "profile_active": 3})
    run_window(ctx, 10)
    (w,) = ctx.of("profile_window")
    assert w["active_steps"] == 3 and w["budget"]["py_calls_per_step"] < 5_000


def test_leaf_c_calls_are_not_kept(tmp_path):
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 3, "profile_active": 1, "profile_dump_flat": 1})
    run_window(ctx, 8, _heavy_batch)
    import gzip

    flat = json.load(gzip.open(ctx.run_dir / "profile_flat.json.gz", "rt"))
    leaves = {n[1] for n in flat["nodes"]}
    assert not [n for n in flat["nodes"] if n[2] == "pyc" and n[0] not in leaves]
    assert flat["leaf_c_calls_dropped"] > 8 * 600  # min/max per pixel


def test_recorded_steps_far_slower_than_plain_stop_the_window(tmp_path, monkeypatch):
    monkeypatch.setattr(pw, "RECORD_MIN_S", 0.0)
    monkeypatch.setattr(pw, "RECORD_SLOWDOWN_MAX", 0.01)  # any recorded step is "too slow"
    ctx = profile_ctx(tmp_path, {"steps": 0, "profile_skip": 3, "profile_active": 3})
    inst = run_window(ctx, 10)
    (w,) = ctx.of("profile_window")
    assert w["status"] == "ok" and w["active_steps"] == 1 and "stopped after 1" in w["stopped_early"]
    assert inst.prof is None and inst.closed


def test_the_call_counter_leaves_a_scripts_profile_function_alone():
    import sys

    def mine(frame, event, arg):
        pass

    sys.setprofile(mine)
    try:
        c = pw._CallCounter()
        assert not c.on and c.stop() is None and sys.getprofile() is mine
    finally:
        sys.setprofile(None)
    c = pw._CallCounter()
    _decode(1)
    n = c.stop()
    assert sys.getprofile() is None and n >= 1200


def test_the_pil_style_script_pays_a_bounded_window():
    p = run_fixture("profile/cpu_pil_style.py", "profile --out {tmp}")  # the session's run
    rep, tmp_path = p.report, p.tmp
    m = rep["metrics"]["profile"]
    assert m["status"] == "ok"
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (w,) = [e for e in events if e["kind"] == "profile_window"]
    assert w["budget"]["py_calls_per_step"] > 15_000 and w["active_steps"] < 3
    assert w["trace_bytes"] < 12 * 2**20  # 19.6 MB with the 3-step window
    assert "gpuGetDeviceCount" not in p.stderr and "profiler_start" not in p.stderr
    assert "Python calls per step" in m["budget"]
    assert "window cost bounded:" in (tmp_path / "report.txt").read_text()
