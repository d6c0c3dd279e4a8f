"""torchdoctor compile: dynamo's messages read into fields, the rules on synthetic evidence, the
eager comparison, the console lines; and the diagnostics instrument in-process on a real compile
(backend "eager": dynamo only, a second or two)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from torchdoctor.compilecheck import summary as cs
from torchdoctor.compilecheck import text
from torchdoctor.compilecheck.compare import compare_eager
from torchdoctor.evidence import Evidence
from torchdoctor.judge import NotApplicable
from torchdoctor.rules import compile as rc

LOOP_BREAK = """Graph break in user code at /w/train.py:21
Graph Break Reason: Failed to handle graph break gracefully. Skipping the function and falling back to eager. Graph break encountered:

Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` to include these operations in the captured graph.

  Developer debug context: call_method TensorVariable() item () {}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html

User code traceback:
  File "/w/train.py", line 30, in <module>
  File "/lib/site-packages/torch/nn/modules/module.py", line 1778, in _wrapped_call_impl
  File "/w/train.py", line 21, in forward
"""
PRINT_BREAK = """Graph break in user code at /lib/site-packages/torch/_dynamo/polyfills.py:12
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str'] (has_kwargs True)
  Hint: Avoid calling builtin `print` with argument types ['str'].

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html

User code traceback:
  File "/w/train.py", line 40, in <module>
  File "/w/model.py", line 14, in forward
  File "/lib/site-packages/torch/_dynamo/polyfills.py", line 12, in helper
"""
LIMIT = """torch._dynamo hit config.recompile_limit (8)
   function: 'forward' (/w/train.py:19)
   last reason: 1/7: self.level == 7                                          #   # w/train.py:20 in forward (HINT: ...)
User stack trace:
  File "/w/train.py", line 20, in forward
To log all recompilation reasons, use TORCH_LOGS="recompiles".
"""
RECOMPILE = """Recompiling function forward in /w/train.py:19
    triggered by the following guard failure(s):
    - 1/0: self.level == 0                                          # return x  # w/train.py:20 in forward
    - User stack trace:
    -   File "/w/train.py", line 20, in forward
"""


def user(f):
    return "site-packages" not in f


def test_a_loop_graph_break_is_read_as_a_skipped_frame_at_the_user_line():
    b = text.parse_graph_break(LOOP_BREAK, user)
    assert (b["file"], b["line"], b["gb"], b["skip"]) == ("/w/train.py", 21, "gb0124", True)
    assert b["url"].endswith("/gb/gb0124.html")
    assert b["reason"].startswith("Dynamo does not support tracing `Tensor.item()`")
    assert b["what"].startswith("Unsupported Tensor.item() call")
    assert b["hint"].startswith("Set `torch._dynamo.config.capture_scalar_outputs")


def test_a_break_inside_a_library_points_to_the_innermost_user_frame_and_is_not_a_skip():
    b = text.parse_graph_break(PRINT_BREAK, user)
    assert (b["file"], b["line"], b["gb"], b["skip"]) == ("/w/model.py", 14, "gb0059", False)
    assert "print" in b["reason"]


def test_a_duplicate_break_keeps_its_location_and_reason():
    msg = ("Graph break (user stack suppressed due to duplicate graph break) in user code at "
           "/w/train.py:21\nGraph Break Reason: Unsupported Tensor.item() call")
    b = text.parse_graph_break(msg, user)
    assert (b["file"], b["line"], b["duplicate"]) == ("/w/train.py", 21, True)


def test_the_limit_warning_and_a_recompile_message_give_the_guard_and_the_line():
    lim = text.parse_limit(LIMIT, user)
    assert lim == {"limit": "recompile_limit", "value": 8, "function": "forward", "file": "/w/train.py",
                   "line": 19, "guard": "self.level == 7", "user_file": "/w/train.py", "user_line": 20}
    assert text.parse_limit("some other warning") is None
    r = text.parse_recompile(RECOMPILE, user)
    assert (r["function"], r["line"], r["guard"], r["user_line"]) == ("forward", 19, "self.level == 0", 20)
    assert text.first_guard("2/3: x.size()[0] == 8  # foo") == "x.size()[0] == 8"


# ---- rules on synthetic evidence ---------------------------------------------------------------
def steps(n, ms=10.0, slow=()):
    return [{"kind": "step", "step": i, "wall_s": (500.0 if i in slow else ms) / 1e3} for i in range(1, n + 1)]


def counters(**kw):
    return {"kind": "dynamo_counters", "loaded": True, "frames": 2, "frames_ok": 1, "graphs": 1,
            "graph_breaks": 0, "recompiles": 0, "limit_hit": False, "compile_s": 1.0, **kw}


def test_graph_break_finding_names_the_line_the_id_and_the_eager_fallback():
    ev = Evidence.from_events([
        *steps(6), counters(),
        {"kind": "dynamo_break", "step": 1, **text.parse_graph_break(LOOP_BREAK, user)},
        {"kind": "dynamo_compile", "step": 1, "function": "forward", "fail": "Unsupported",
         "fail_reason": "Unsupported Tensor.item() call", "fail_file": "/w/train.py", "fail_line": 21,
         "guarded": False, "seconds": 0.7}])
    (f,) = rc.compile_graph_break(ev)
    assert f.severity == "warning" and "/w/train.py:21" in f.title and "runs eager" in f.title
    (site,) = f.evidence["sites"]
    assert site["id"] == "gb0124" and site["whole_function_eager"] and site["times"] == 1
    assert f.evidence["functions_run_eager"] == 1


def test_a_frame_that_failed_without_a_log_message_is_a_skipped_site():
    ev = Evidence.from_events([*steps(4), counters(), {
        "kind": "dynamo_compile", "step": 1, "function": "forward", "fail": "Unsupported",
        "fail_reason": "Unsupported Tensor.item() call ... gb/gb0124.html", "fail_gb": "gb0124",
        "fail_file": "/w/train.py", "fail_line": 21, "guarded": False}])
    (site,) = cs.break_sites(ev)
    assert site["skip"] and site["where"] == "/w/train.py:21" and site["gb"] == "gb0124"


def recompile_events(n, start=2):
    return [{"kind": "dynamo_compile", "step": start + i, "function": "forward", "file": "/w/m.py",
             "line": 19, "recompile_guard": f"self.mode == {i}", "recompile_file": "/w/m.py",
             "recompile_line": 20, "seconds": 0.3} for i in range(n)]


@pytest.mark.parametrize("n,raised", [(rc.RECOMPILES_MIN - 1, False), (rc.RECOMPILES_MIN, True)])
def test_recompiles_are_raised_from_the_threshold(n, raised):
    ev = Evidence.from_events([*steps(8), counters(), *recompile_events(n)])
    out = rc.compile_recompiles(ev)
    assert bool(out) is raised
    if raised:
        assert "self.mode == 0" in out[0].title and "/w/m.py:20" in out[0].title
        assert "mark_dynamic" in out[0].fix and "tensor" in out[0].fix


def test_the_limit_names_step_guard_line_and_the_step_times_before_and_after():
    ev = Evidence.from_events([
        *steps(12, slow=range(1, 10)), counters(limit_hit=True), *recompile_events(7),
        *[{"kind": "dynamo_step", "step": s, "records": 1, "compile_s": 0.4} for s in range(1, 10)],
        {"kind": "dynamo_limit", "step": 9, **text.parse_limit(LIMIT, user)}])
    (f,) = rc.compile_recompile_limit(ev)
    assert f.severity == "error" and "step 9" in f.title and "self.level == 7" in f.title
    assert f.evidence["read_at"] == "/w/train.py:20"
    assert f.evidence["step_ms_before"] == 500.0 and f.evidence["steps_before"] == 7  # warm-up step 1 out
    assert f.evidence["step_ms_after"] == 10.0 and f.evidence["steps_after"] == 3
    # the same function is not reported twice (recompiles is the limit's)
    ev2 = Evidence.from_events([*steps(12), counters(), *recompile_events(8, start=1),
                                {"kind": "dynamo_limit", "step": 9, "limit": "recompile_limit", "value": 8,
                                 "function": "forward", "file": "/w/m.py", "line": 19}])
    assert rc.compile_recompiles(ev2) == [] and len(rc.compile_recompile_limit(ev2)) == 1


def test_not_used_is_info_and_points_to_treat():
    ev = Evidence.from_events([*steps(3), {"kind": "dynamo_counters", "loaded": False}])
    (f,) = rc.compile_not_used(ev)
    assert f.severity == "info" and "treat --try compile" in f.fix
    assert rc.compile_not_used(Evidence.from_events([*steps(3), counters()])) == []
    with pytest.raises(NotApplicable):
        rc.compile_graph_break(ev)


def test_checkup_notes_a_compiled_model_as_info_and_warns_only_on_a_measured_limit():
    (f,) = rc.compile_in_use(Evidence.from_events([*steps(3), counters(graphs=2, recompiles=1)]))
    assert f.severity == "info" and "torchdoctor compile" in f.fix
    (g,) = rc.compile_in_use(Evidence.from_events([*steps(3), counters(limit_hit=True)]))
    assert g.severity == "warning" and "recompile limit" in g.title
    assert rc.compile_in_use(Evidence.from_events([*steps(3), {"kind": "dynamo_counters", "loaded": True,
                                                               "frames": 0}])) == []


def test_compile_steps_are_left_out_of_the_steady_time_and_of_the_eager_side():
    ev = Evidence.from_events([*steps(6, slow=(1, 2)), counters(),
                               {"kind": "dynamo_step", "step": 1}, {"kind": "dynamo_step", "step": 2}])
    m = cs.summarize(ev)
    assert m["compile_steps"] == [1, 2] and m["steady_steps"] == 4 and m["compiled_step_ms"] == 10.0
    eager = Evidence.from_events(steps(6, ms=20.0, slow=(2,)))
    got = compare_eager(m, eager, None)
    assert got == {"eager_step_ms": 20.0, "eager_steps": 4, "speedup": 2.0}
    assert "failed" in compare_eager(m, eager, "RuntimeError: boom")["eager_skipped"]
    still = Evidence.from_events([*steps(6), counters(frames_ok=1)])  # the switch did not hold
    assert "could not be switched off" in compare_eager(m, still, None)["eager_skipped"]


def test_the_console_lines_say_compile_time_apart_and_the_speed_up():
    from torchdoctor.report.sections.compile import compile_lines

    lines = compile_lines({"compiled": True, "graphs": 1, "graph_breaks": 0, "recompiles": 0,
                           "compile_s": 6.9, "compile_steps": [1], "steady_steps": 7,
                           "compiled_step_ms": 5.0, "eager_step_ms": 10.0, "eager_steps": 7, "speedup": 2.0})
    assert "compiling took 6.9 s in step(s) 1" in lines[0]
    assert "5 ms compiled" in lines[1] and "10 ms eager" in lines[1] and "2.00× faster" in lines[1]
    assert compile_lines({"compiled": False}) == []


# ---- the instrument in-process on a real (eager-backend) compile -------------------------------
def test_the_instrument_reads_a_real_break_prints_nothing_and_restores_dynamos_loggers(capfd):
    torch = pytest.importorskip("torch")
    from torchdoctor import torch_internals as ti
    from torchdoctor.instruments.dynamo.dynamo_diag import DynamoDiag
    from torchdoctor.instruments.testing import RecordingContext

    names = [q for a in ("graph_breaks",) for q in ti.DYNAMO_ARTIFACT_LOGGERS[a]]
    before = {q: (logging.getLogger(q).level, logging.getLogger(q).propagate) for q in names}
    ctx, inst = RecordingContext("compile"), DynamoDiag()
    inst.install(ctx)
    try:
        def fn(x):
            y = x * 2
            if y.sum().item() > 0:  # a graph break (not in a loop: dynamo resumes after it)
                y = y + 1
            return y

        f = torch.compile(fn, backend="eager")
        for i in range(3):
            f(torch.ones(4))
            ctx.step = i + 1
            inst.on_step_end(ctx, i + 1)
    finally:
        inst.uninstall(ctx)
        torch._dynamo.reset()
    breaks = [e for e in ctx.events if e["kind"] == "dynamo_break"]
    assert breaks and breaks[0]["file"] == __file__ and breaks[0]["gb"] == "gb0124"
    assert breaks[0]["line"] == test_the_instrument_reads_a_real_break_prints_nothing_and_restores_dynamos_loggers.__code__.co_firstlineno + 13
    assert not breaks[0]["skip"]
    assert [e["step"] for e in ctx.events if e["kind"] == "dynamo_step"] == [1]
    assert any(e["kind"] == "dynamo_compile" and e["function"] == "fn" for e in ctx.events)
    err = capfd.readouterr().err
    assert "Graph break in user code" not in err  # the channel was read, not printed
    assert {q: (logging.getLogger(q).level, logging.getLogger(q).propagate) for q in names} == before
    assert Path(__file__).exists()


def test_the_compiled_wrapper_carries_our_hooks_into_no_copy_or_pickle():
    """torch.compile's wrapper takes per-root hooks (a global stand-in would be a change of the
    global hook set that dynamo guards on: a recompile of every compiled function)."""
    torch = pytest.importorskip("torch")
    import copy
    import pickle

    from torchdoctor.runner.userhooks import hookable, register_on

    inner = torch.nn.Linear(2, 2)
    wrapped = torch.compile(inner, backend="eager")
    assert hookable(wrapped) and hookable(inner)
    calls = []
    handle, hook = register_on(wrapped, "forward", lambda m, a, o: calls.append(1))  # a lambda: unpicklable
    try:
        wrapped(torch.ones(1, 2))
        assert calls == [1]
        twin = copy.deepcopy(wrapped)
        assert not twin._forward_hooks and not twin._orig_mod._forward_hooks
        pickle.dumps(wrapped)
    finally:
        handle.remove()
        torch._dynamo.reset()


def test_the_eager_run_is_skipped_with_a_reason_where_it_cannot_compare():
    from torchdoctor.commands.compile import eager_comparison
    from torchdoctor.findings import Report
    from torchdoctor.pipeline.options import RunOptions

    def report(status=None):
        r = Report(command="compile")
        r.metrics["compile"] = {"compiled": True}
        r.run_status = status
        return r

    r = report()
    eager_comparison(r, "x.py", [], RunOptions(probe={"no_eager": True}))
    assert r.metrics["compile"] == {"compiled": True}
    r = report("crashed")
    eager_comparison(r, "x.py", [], RunOptions())
    assert r.metrics["compile"]["eager_skipped"] == "the compiled run did not finish"
    r = report()
    eager_comparison(r, "x.py", [], RunOptions(nproc_per_node=2))
    assert "--nproc-per-node" in r.metrics["compile"]["eager_skipped"]
