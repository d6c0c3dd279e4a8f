"""End-to-end on the fixture scripts, run in-process for speed (the harness core + the probe's
instruments around ``runpy``, the rules, the follow-ups), plus a few real CLI runs.

Every sick script raises exactly its expected warning/error codes, at the step the planted
fault first happens; every healthy script raises none. The CLI tests check the same through
``python -m torchdoctor`` (exit codes, JSON, the follow-up re-run in a child).
"""

from __future__ import annotations

import runpy
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from fixture_runs import run_fixture
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"


def run_inprocess(probe: str, script: Path, args=(), options=None) -> Evidence:
    """What the child harness does, in this process: install, runpy, uninstall, evidence."""
    from torchdoctor.runner.context import HarnessContext, StopRun
    from torchdoctor.runner.core import Core
    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.harness import _armed, _exception_record, step_facts
    from torchdoctor.runner.rundir import META, RESULT, EvidenceWriter, write_json

    opts = {"steps": 50, **(options or {})}
    d = Path(tempfile.mkdtemp(prefix="td-nan-test-"))
    write_json(d / META, {"probe": probe, "argv": [str(script), *args], "options": opts})
    writer = EvidenceWriter(d)
    ctx = HarnessContext(probe, d, opts, writer)
    core = Core(ctx, _armed(sorted(armed_needs(probe))))
    result = {"outcome": "exit", "exit_code": 0}
    argv, path0 = sys.argv, sys.path[0]
    quiet = warnings.catch_warnings(record=True)  # the scripts' (and anomaly mode's) warnings
    quiet.__enter__()
    core.install()
    try:
        sys.argv = [str(script), *args]
        runpy.run_path(str(script), run_name="__main__")
    except StopRun as e:
        result = {"outcome": "stopped", "exit_code": 0, "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - the script's crash is evidence
        result = {"outcome": "crash", "exit_code": 1, "exception": _exception_record(e)}
        core.crash(e)
    finally:
        sys.argv, sys.path[0] = argv, path0
        result.update(step_facts(ctx, core))
        core.uninstall()
        quiet.__exit__(None, None, None)
        write_json(d / RESULT, result)
        writer.close()
    return Evidence.load(d)


def judge(probe: str, script: Path, args=(), options=None) -> Report:
    """Rules of the run and of the probe, then the follow-ups (re-runs in-process too)."""
    from torchdoctor.pipeline.judging import judge_run

    ev = run_inprocess(probe, script, args, options)

    def relaunch(extra, probe=None, _first=probe):  # a follow-up may re-run under another probe
        return run_inprocess(probe or _first, script, args, {**(options or {}), **extra})

    report = judge_run(probe, ev, target=str(script), relaunch=relaunch)
    return report


def report_from_json(d: dict) -> Report:
    """The Report a run's JSON was written from (findings, skipped rules, metrics, context, the
    run's own status): what a command renders, for the console tests that render the session's
    run in this process (a console run of its own costs a torch process, ~5 s of CPU)."""
    from torchdoctor.findings import Finding, Skipped

    rep = Report(command=d["command"], target=d.get("target"), metrics=d.get("metrics") or {},
                 artifacts=d.get("artifacts") or {}, context=d.get("context") or {})
    rep.findings = [Finding(**{k: f[k] for k in ("code", "skill", "severity", "title", "evidence",
                                                  "fix", "docs")}) for f in d["findings"]]
    rep.skipped = [Skipped(x["rule"], x["reason"]) for x in d.get("skipped") or []]
    if d.get("status") in ("crashed", "timeout", "interrupted", "error"):
        rep.run_status = d["status"]
    return rep


def codes(report: Report) -> set[str]:
    return {f.code for f in report.findings if f.severity in ("error", "warning")}


def by_code(report: Report, code: str):
    return next(f for f in report.findings if f.code == code)


def _global_hook_counts():
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o

    return (len(m._global_forward_pre_hooks), len(m._global_forward_hooks),
            len(o._global_optimizer_pre_hooks), len(o._global_optimizer_post_hooks))


# Which codes each fixture raises, at which step, is its `# expect:` header and its golden
# (tests/test_fixtures.py runs every fixture through the CLI once). Here: what only an
# in-process run can see.
@pytest.mark.parametrize("script", ["nan/forward_div.py", "training/inplace.py"])
def test_instruments_leave_no_global_hooks_behind(script):
    before = _global_hook_counts()
    rep = judge("nan", SCRIPTS / script, options={"rerun": False})
    assert _global_hook_counts() == before, "instruments left global hooks behind"
    assert rep.findings


def test_forward_op_is_named_by_the_rerun():
    f = by_code(judge("nan", SCRIPTS / "nan/forward_div.py"), "nonfinite-forward")
    assert f.evidence["module"] == "model.0" and f.evidence["module_class"] == "Standardize"
    assert f.evidence["op"] == "aten::div"
    assert f.evidence["op_code"] == "return (x - mu) / sd"
    assert f.evidence["op_line"].endswith("forward_div.py:19 in forward")
    assert "NaN 8" in f.evidence["output_stats"][0]


def test_parent_code_and_loss_ops_are_named():
    f = by_code(judge("nan", SCRIPTS / "nan/between_children.py"), "nonfinite-forward")
    assert f.evidence["module"] == "net" and f.evidence["op"] == "aten::log"
    assert f.evidence["op_code"] == "h = torch.log(h)"
    g = by_code(judge("nan", SCRIPTS / "nan/loss_log.py"), "nonfinite-loss")
    assert g.evidence["op"] == "aten::log" and "torch.log" in g.evidence["op_code"]


def test_deliberate_minus_inf_mask_is_not_the_culprit():
    f = by_code(judge("nan", SCRIPTS / "nan/masked_attention.py", ("4",)), "nonfinite-forward")
    assert f.evidence["module"] == "model" and f.evidence["op"] == "aten::_softmax"
    assert "PadMask" in f.evidence["earlier_neg_inf"]


def test_output_modified_in_place_by_the_caller_names_the_caller_and_the_child():
    """``out += x`` after a child made Inf: the child's own record is gone (modified before
    the reduction), the caller is named with the child, and the re-run names the op."""
    f = by_code(judge("nan", SCRIPTS / "nan/inplace_residual.py"), "nonfinite-forward")
    assert f.evidence["module"] == "model.0" and f.evidence["module_class"] == "Block"
    assert "model.0.damp (Damp)" in f.evidence["modified_in_place"]
    assert f.evidence["op"] == "aten::div" and f.evidence["op_code"] == "return x / self.scale"


# the fused CUDA reduction (max |x| per tensor, one call per dtype) run on CPU tensors
FUSED = [
    ("nan/forward_div.py", (), "nonfinite-forward", 6, "model.0"),
    ("nan/input_nan.py", (), "nonfinite-forward", 4, "model"),
    ("nan/between_children.py", (), "nonfinite-forward", 3, "net"),
    ("nan/masked_attention.py", ("4",), "nonfinite-forward", 5, "model"),
    ("nan/inplace_residual.py", (), "nonfinite-forward", 4, "model.0"),
    ("nan/grad_sqrt.py", (), "nonfinite-gradient", 5, None),
    ("nan/loss_log.py", (), "nonfinite-loss", 4, None),
]


@pytest.mark.parametrize("script,args,code,step,module", FUSED, ids=[s[0] for s in FUSED])
def test_fused_reduction_finds_the_same_first_value(script, args, code, step, module):
    rep = judge("nan", SCRIPTS / script, args, {"nan_fused_cpu": True, "rerun": False})
    assert codes(rep) == {code}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, code)
    assert f.evidence["step"] == step
    if module is not None:
        assert f.evidence["module"] == module
    if script == "nan/masked_attention.py":
        assert "PadMask" in f.evidence["earlier_neg_inf"] and "Inf (no NaN)" in f.evidence["earlier_neg_inf"]
    if code == "nonfinite-forward" and "outputs" in f.evidence:
        assert all("max|x|" in line for line in f.evidence["outputs"])


@pytest.mark.parametrize("script", ["nan/healthy_mlp.py", "nan/masked_attention.py",
                                    "nan/healthy_mixed.py"])
def test_fused_reduction_healthy_raises_nothing(script):
    rep = judge("nan", SCRIPTS / script, options={"nan_fused_cpu": True})
    assert codes(rep) == set(), [(f.code, f.title) for f in rep.findings]


def test_gradient_names_the_parameter_nearest_the_loss():
    f = by_code(judge("nan", SCRIPTS / "nan/grad_sqrt.py"), "nonfinite-gradient")
    assert f.evidence["param"].startswith("encoder.2.")
    assert f.evidence["loss"] == "finite" and "NaN" in f.evidence["grad"]


def test_input_nan_blames_the_data_not_a_layer():
    f = by_code(judge("nan", SCRIPTS / "nan/input_nan.py"), "nonfinite-forward")
    assert "the data" in f.title and f.evidence["module"] == "model"


def test_inplace_followup_names_forward_line_and_custom_function():
    f = by_code(judge("nan", SCRIPTS / "training/inplace.py"), "inplace-modified")
    assert f.evidence["forward_op"] == "Sigmoid"
    assert f.evidence["forward_code"] == "gate = torch.sigmoid(self.fc(x))"
    assert f.evidence["forward_line"].endswith("inplace.py:23 in forward")
    g = by_code(judge("nan", SCRIPTS / "training/inplace_custom_fn.py"), "inplace-modified")
    assert g.evidence["custom_function"] == "Square"
    assert g.skill == "custom-autograd-functions"
    import torch

    assert not torch.is_anomaly_enabled(), "the follow-up left anomaly mode on"


def test_bfloat16_does_not_overflow_where_float16_does():
    rep = judge("nan", SCRIPTS / "nan/fp16_overflow.py", ("bfloat16",))
    assert not codes(rep) & {"nonfinite-forward", "nonfinite-loss", "nonfinite-gradient"}


@pytest.mark.parametrize("script,args,module,op", [
    ("nan/forward_div.py", (), "model.0 (Standardize)", "aten::div"),
    ("nan/between_children.py", (), "net (Net)", "aten::log"),
    ("nan/masked_attention.py", ("4",), "model (Attn)", "aten::_softmax"),
])
def test_without_forward_watch_the_rerun_checks_the_whole_step(script, args, module, op):
    rep = judge("nan", SCRIPTS / script, args, {"forward_watch": False})
    f = by_code(rep, "nonfinite-loss")
    assert f.evidence["op"] == op and f.evidence["op_module"] == module
    assert "re-run" in f.title


def test_checkup_sees_nonfinite_loss_without_forward_watch():
    rep = judge("checkup", SCRIPTS / "nan/loss_log.py", options={"rerun": False})  # no replay
    f = by_code(rep, "nonfinite-loss")
    assert f.evidence["step"] == 4 and f.evidence.get("forward_watch") is False


@pytest.mark.parametrize("script,args,code,step", [
    ("nan/forward_div.py", (), "nonfinite-forward", 6),
    ("nan/grad_sqrt.py", (), "nonfinite-gradient", 5),
    ("nan/loss_log.py", (), "nonfinite-loss", 4),
    ("nan/masked_attention.py", ("4",), "nonfinite-forward", 5),
])
def test_rows_read_a_step_late_keep_the_step(script, args, code, step):
    """On CUDA the rows come back asynchronously, a step or more late (no sync): simulated."""
    rep = judge("nan", SCRIPTS / script, args, {"nan_async_test": True})
    assert codes(rep) == {code}
    assert by_code(rep, code).evidence["step"] == step


def test_monitor_reads_once_per_step_in_nan_and_every_8_in_checkup():
    ev = run_inprocess("nan", SCRIPTS / "nan/healthy_accum.py")
    mon = ev.last("nan_monitor")
    assert mon["rows"] == 20 and mon["reads"] == 20 and mon["forward_watch"] is True
    ev = run_inprocess("checkup", SCRIPTS / "nan/healthy_accum.py")
    mon = ev.last("nan_monitor")
    assert mon["rows"] == 20 and mon["reads"] == 3 and mon["forward_watch"] is False


def test_metrics_series():
    rep = judge("nan", SCRIPTS / "nan/forward_div.py", options={"rerun": False})
    m = rep.metrics["nan"]
    assert m["forward_watch"] is True and m["check_every"] == 1
    assert [p[0] for p in m["series"]] == [1, 2, 3, 4, 5, 6]
    assert m["series"][-1][2] == "nan" and m["first_nonfinite"]["step"] == 6


def test_no_rerun_option_skips_the_followup():
    f = by_code(judge("nan", SCRIPTS / "nan/forward_div.py", options={"rerun": False}),
                "nonfinite-forward")
    assert "op" not in f.evidence


# ---------------------------------------------------------------------------- real CLI
def test_cli_nan_json_and_exit_code():
    r = run_fixture("nan/forward_div.py", "nan")  # the session's run (tests/test_fixtures.py)
    assert r.returncode == 1, r.stderr
    d = r.report
    assert d["command"] == "nan" and d["status"] == "findings"
    f = [x for x in d["findings"] if x["code"] == "nonfinite-forward"][0]
    assert f["evidence"]["step"] == 6 and f["evidence"]["op"] == "aten::div"
    assert d["metrics"]["nan"]["first_nonfinite"]["step"] == 6


def test_cli_nan_healthy_console(monkeypatch):
    """`nan`'s console report of a healthy run: the session's run of nan/healthy_accum.py
    (tests/test_fixtures.py), rendered by the command in this process."""
    from conftest import run_main

    run = run_fixture("nan/healthy_accum.py", "nan")  # the session's run
    assert run.returncode == 0 and run.report["findings"] == [], run.report["findings"]
    seen = []

    def run_probe(probe, target, args, options):
        seen.append((probe, target))
        return report_from_json(run.report)

    monkeypatch.setattr("torchdoctor.pipeline.run.run_probe", run_probe)
    r = run_main("nan", "healthy_accum.py", cwd=SCRIPTS / "nan")
    assert seen == [("nan", "healthy_accum.py")]
    assert r.returncode == 0, r.stderr
    assert "No problems found" in r.stdout


def test_cli_nan_bad_input(cli_inproc):
    r = cli_inproc("nan", "no/such/train.py")
    assert r.returncode == 2 and "script not found" in r.stderr
    assert "Traceback" not in r.stderr


def test_passthrough_modules_alias_their_checked_input_and_the_source_is_still_named():
    """ReLU(inplace)/Dropout/Flatten after a Linear are not reduced again (fewer reductions a
    step), and the NaN the Linear makes is still named at the Linear, at its step."""
    import torch

    calls = []
    real = torch.aminmax
    torch.aminmax = lambda t, *a, **k: calls.append(tuple(t.shape)) or real(t, *a, **k)
    try:
        rep = judge("nan", SCRIPTS / "nan/through_passthrough.py", options={"rerun": False})
    finally:
        torch.aminmax = real
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["module"] == "model.0" and f.evidence["module_class"] == "Linear"
    assert f.evidence["step"] == 5
    # per healthy step: model input, Linear 0 out, Linear 4 out (the root's output is the
    # last Linear's output): 3 reductions for 6 module calls, none for ReLU/Dropout/Flatten
    assert len(calls) / 5 <= 3.2, calls[:12]


def test_a_failing_hook_reports_and_never_reaches_the_script(monkeypatch):
    """An exception inside a global hook the monitor registered itself: the script runs to its
    end, the failure is one internal-error finding, and the monitor's hooks are gone."""
    from torchdoctor.instruments.nan.nan_monitor import NanMonitor

    def boom(*a, **k):
        raise ValueError("planted failure")

    monkeypatch.setattr(NanMonitor, "_defer", staticmethod(boom))
    before = _global_hook_counts()
    ev = run_inprocess("nan", SCRIPTS / "nan/healthy_mlp.py")
    assert _global_hook_counts() == before
    assert ev.result["outcome"] == "exit", ev.result
    errs = [e for e in ev.of("instrument_error") if e["instrument"] == "nan_monitor"]
    assert len(errs) == 1 and errs[0]["callback"] == "_fwd_pre"
    assert "planted failure" in errs[0]["traceback"]


def test_fused_reduction_falls_back_to_aminmax_when_it_is_not_supported(monkeypatch):
    """A torch or a tensor subclass without the fused inf-norm: reduced per tensor instead."""
    import torch

    real = torch._foreach_norm

    def picky(ts, ord=2, **kw):
        if ord == float("inf"):
            raise NotImplementedError("no inf-norm here")
        return real(ts, ord, **kw)

    monkeypatch.setattr(torch, "_foreach_norm", picky)
    rep = judge("nan", SCRIPTS / "nan/forward_div.py", options={"nan_fused_cpu": True, "rerun": False})
    assert codes(rep) == {"nonfinite-forward"}, [(f.code, f.title) for f in rep.findings]
    f = by_code(rep, "nonfinite-forward")
    assert f.evidence["step"] == 6 and f.evidence["module"] == "model.0"
    assert all("min/max" in line for line in f.evidence["outputs"])


def test_the_grad_norm_shown_is_the_one_before_clipping_and_clipping_is_counted():
    """Issue 27 item 10: under clip_grad_norm_(..., 1.0) the column read 1.0 every step (the norm
    after clipping); it shows what clip_grad_norm_ returned and how often it clipped."""
    from torchdoctor.pipeline.nan_metrics import nan_metrics

    ev = run_inprocess("checkup", SCRIPTS / "nan/clipped_grads.py")
    m = nan_metrics(ev)
    assert m["series_columns"][-2:] == ["grad_norm_pre_clip", "clip_max"]
    pre = [p[4] for p in m["series"]]
    after = [p[3] for p in m["series"]]
    assert len(pre) >= 10 and all(v > 10 for v in pre), pre
    assert all(abs(v - 1.0) < 1e-3 for v in after), after  # what the optimizer used
    assert m["clipping"] == {"max_norm": 1.0, "steps": len(pre), "clipped_steps": len(pre), "steps_without_clip": 0}
    # the CUDA row path (norms stacked on the device, read a step later), simulated on the CPU
    deferred = nan_metrics(run_inprocess("checkup", SCRIPTS / "nan/clipped_grads.py",
                                         options={"nan_async_test": True}))
    assert [round(p[4], 3) for p in deferred["series"]] == [round(v, 3) for v in pre]
    assert deferred["clipping"]["clipped_steps"] == len(pre)
    # a run without clipping keeps its four columns
    plain = nan_metrics(run_inprocess("checkup", SCRIPTS / "nan/healthy_mlp.py"))
    assert plain["series_columns"] == ["step", "optimizer", "loss", "grad_norm"] and "clipping" not in plain
