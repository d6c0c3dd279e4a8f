"""treat on numbers and on data: verdicts, the loss check, the plan, the catalogue, fixes (no run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.treat.catalogue import BF16, BY_NAME, CATALOGUE, EXACT, REORDER, TF32, parse_try
from torchdoctor.treat.plan import combination, plan
from torchdoctor.treat.verdict import (LOSS_FLOOR, MEM_BLOWUP, NONREPRO_FACTOR, SINGLE_ROUND_NOISE, band_of,
                                       loss_check, verdict)


# ---- verdicts on synthetic numbers ------------------------------------------------------------
def V(**kw):
    base = dict(intent="speed", speedup=1.0, band=0.05, loss_ok=True)
    base.update(kw)
    return verdict(**base)


def test_faster_beyond_the_band_with_the_loss_kept_is_adopted():
    assert V(speedup=1.8)[0] == "adopt"
    assert V(speedup=1.04)[0] == "noise"  # inside ±5 %
    assert V(speedup=1.06, band=0.05)[0] == "adopt"


def test_slower_beyond_the_band_is_rejected():
    v, why = V(speedup=0.8)
    assert v == "reject" and "slower" in why
    assert V(speedup=0.96)[0] == "noise"


def test_a_loss_drift_rejects_even_a_fast_trial():
    v, why = V(speedup=3.0, loss_ok=False, max_rel_diff=0.2, allowed=0.02)
    assert v == "reject" and "0.2" in why and "0.02" in why


def test_a_failure_wins_over_everything_and_names_the_error():
    v, why = V(speedup=3.0, failure="RuntimeError: boom at train.py:3")
    assert (v, why) == ("failed", "RuntimeError: boom at train.py:3")


def test_a_memory_blow_up_rejects_a_speed_trial():
    v, why = V(speedup=2.0, peak_before=100.0, peak_after=100.0 * (1 + MEM_BLOWUP) + 1)
    assert v == "reject" and "peak memory" in why
    assert V(speedup=2.0, peak_before=100.0, peak_after=110.0)[0] == "adopt"


def test_a_memory_trial_is_adopted_for_memory_saved_or_an_oom_avoided():
    assert V(intent="memory", peak_before=100.0, peak_after=80.0)[0] == "adopt"
    assert V(intent="memory", peak_before=100.0, peak_after=99.0)[0] == "noise"
    assert V(intent="memory", baseline_oom=True, speedup=None)[0] == "adopt"
    assert V(intent="memory", peak_before=100.0, peak_after=80.0, speedup=0.5)[0] == "reject"
    # memory saved at a small cost in speed: adopted, the cost stated
    assert V(intent="memory", peak_before=100.0, peak_after=80.0, speedup=0.93) == (
        "adopt", "peak memory 20% lower, at 0.93x the speed")


def test_one_round_widens_the_noise_band():
    assert band_of(0.01, 0.0, 2, 2, 0.02) == 0.02
    assert band_of(0.30, 0.01, 2, 2, 0.02) == 0.30
    assert band_of(None, None, 1, 2, 0.02) == SINGLE_ROUND_NOISE


# ---- the loss check -----------------------------------------------------------------------------
def test_a_reproducible_script_is_held_to_the_treatment_tolerance():
    base = [[1.0, 0.9, 0.8], [1.0, 0.9, 0.8]]
    ok = loss_check(base, [[1.0, 0.9, 0.800001]], EXACT)
    assert ok["ok"] is True and ok["reproducible"] is True and ok["baseline_drift"] == 0.0
    bad = loss_check(base, [[1.0, 0.9, 0.81]], EXACT)
    assert bad["ok"] is False and bad["max_rel_diff"] == pytest.approx(0.01 / 0.81)


def test_a_nonreproducible_baseline_widens_the_allowance_and_says_so():
    base = [[1.0, 0.9, 0.8], [1.0, 0.9, 0.808]]  # the script's own rounds differ by 1 %
    got = loss_check(base, [[1.0, 0.9, 0.815]], EXACT)
    assert got["reproducible"] is False
    assert got["allowed"] == pytest.approx(NONREPRO_FACTOR * 0.008 / 0.808)
    assert got["ok"] is True and "not reproducible" in got["note"]


def test_a_nonfinite_treated_loss_fails_the_check():
    got = loss_check([[1.0, 0.9], [1.0, 0.9]], [[1.0, "nan"]], BF16)
    assert got["ok"] is False and "non-finite loss at step 2" in got["note"]


def test_a_loss_near_zero_is_judged_against_the_loss_scale():
    base = [[2.0, 1e-7], [2.0, 1e-7]]
    got = loss_check(base, [[2.0, 3e-7]], REORDER)  # 2e-7 apart on a scale of 2: kept
    assert got["ok"] is True and got["max_rel_diff"] == pytest.approx(2e-7 / (LOSS_FLOOR * 2.0))


def test_no_loss_on_one_side_is_not_compared():
    assert loss_check([[1.0]], [], EXACT)["ok"] is None


# ---- the catalogue and --try --------------------------------------------------------------------
def test_the_catalogue_names_the_issue_lists():
    assert [t.name for t in CATALOGUE] == [
        "dataloader-workers", "pin-memory", "tf32", "bf16-autocast", "channels-last",
        "fused-optimizer", "cudnn-benchmark", "expandable-segments", "compile", "set-to-none",
        "ddp-bucket-cap", "fsdp-bf16", "compile-blocks"]
    assert BY_NAME["tf32"].tolerance == TF32 and BY_NAME["bf16-autocast"].tolerance == BF16
    assert TF32 < BF16 and EXACT < TF32


def test_every_treatment_has_an_applier_in_its_family_module():
    import importlib

    for t in CATALOGUE:
        mod = importlib.import_module(f"torchdoctor.treat.{t.family}")
        assert mod.APPLIERS[t.name].name == t.name


def test_try_parses_names_and_values_and_refuses_unknowns():
    assert parse_try("tf32") == ("tf32", None)
    assert parse_try("dataloader-workers=4") == ("dataloader-workers", "4")
    assert parse_try("compile=eager") == ("compile", "eager")
    with pytest.raises(ValueError, match="did you mean tf32"):
        parse_try("tf23")
    with pytest.raises(ValueError, match="takes no value"):
        parse_try("tf32=1")
    with pytest.raises(ValueError, match="number of workers"):
        parse_try("dataloader-workers=lots")


def test_docs_treat_page_lists_every_treatment_and_tolerance():
    text = (Path(__file__).resolve().parents[1] / "docs" / "treat.md").read_text()
    for t in CATALOGUE:
        assert f"`{t.name}`" in text, t.name
    for name, value in (("EXACT", EXACT), ("TF32", TF32), ("BF16", BF16)):
        assert f"`{name}` = {value:g}" in text, name


# ---- the plan -----------------------------------------------------------------------------------
SURVEY = {"cpus": 2, "loaders": [{"site": "t.py:9", "num_workers": 0, "pin_memory": False,
                                  "iterable": False}],
          "optimizers": [{"cls": "Adam", "module": "torch.optim.adam", "fused": None}],
          "zero_grad_false": [], "models": [{"cls": "Net", "has_conv": True, "dtypes": ["float32"],
                                            "autocast": False, "channels_last": False,
                                            "compiled": False, "shapes_vary": False}],
          "flags": {"float32_matmul_precision": "highest", "cudnn_benchmark": False},
          "device": {"cuda": True, "bf16": True}, "alloc_conf": ""}


def _names(p):
    return [t.name for t in p.trials], dict(p.skipped)


def test_on_cpu_a_loader_bound_script_gets_only_the_workers_trial():
    tried, skipped = _names(plan(SURVEY, {"dataloader-bound"}, on_cuda=False))
    assert tried == ["dataloader-workers"]
    assert skipped["tf32"] == "no CUDA" and skipped["pin-memory"] == "no CUDA"
    assert skipped["bf16-autocast"] == "no CUDA; `--try bf16-autocast` runs it on CPU"
    assert "default since torch 2.0" in skipped["set-to-none"]


def test_on_cuda_the_gpu_treatments_are_chosen_and_compile_not_when_data_bound():
    tried, skipped = _names(plan(SURVEY, {"dataloader-bound"}, on_cuda=True))
    assert tried == ["dataloader-workers", "pin-memory", "tf32", "bf16-autocast", "channels-last",
                     "fused-optimizer", "cudnn-benchmark"]
    assert "data-bound" in skipped["compile"]
    assert skipped["expandable-segments"].startswith("no memory-fragmentation or out-of-memory")
    tried, _ = _names(plan(SURVEY, {"memory-fragmentation"}, on_cuda=True))
    assert "expandable-segments" in tried and "compile" in tried and "dataloader-workers" not in tried


def test_reserved_far_above_the_live_peak_chooses_expandable_segments():
    MiB = 2**20
    p = plan(SURVEY, set(), on_cuda=True, peaks={"allocated": 1000 * MiB, "reserved": 2100 * MiB})
    why = next(t.why for t in p.trials if t.name == "expandable-segments")
    assert why == "the allocator reserved 2.1x its peak of live tensors (1100 MiB more)"
    p = plan(SURVEY, set(), on_cuda=True, peaks={"allocated": 100 * MiB, "reserved": 200 * MiB})
    assert "expandable-segments" in dict(p.skipped)  # 2x, but only 100 MiB: not worth a trial


def test_try_replaces_the_choice_but_never_runs_an_impossible_trial():
    p = plan(SURVEY, set(), on_cuda=False, forced=[("tf32", None), ("fused-optimizer", None)])
    assert _names(p) == (["fused-optimizer"], {"tf32": "no CUDA"})
    s = {**SURVEY, "models": [{**SURVEY["models"][0], "autocast": True}]}
    _, skipped = _names(plan(s, set(), on_cuda=True, forced=[("bf16-autocast", None)]))
    assert skipped == {"bf16-autocast": "the script already runs its forward under autocast"}


def test_a_failed_baseline_skips_every_trial_but_the_oom_cure():
    p = plan(SURVEY, {"out-of-memory"}, on_cuda=True, baseline_failure="OutOfMemoryError: x",
             baseline_oom=True)
    assert [t.name for t in p.trials] == ["expandable-segments"]
    assert all(r.startswith("the baseline did not train") for _, r in p.skipped)


def test_workers_already_enough_is_skipped_with_the_count():
    s = {**SURVEY, "loaders": [{**SURVEY["loaders"][0], "num_workers": 4}]}
    _, skipped = _names(plan(s, {"dataloader-bound"}, on_cuda=False))
    assert skipped["dataloader-workers"] == "num_workers already >= 2 (of 2 CPUs)"


def test_the_combination_keeps_the_fastest_of_a_group():
    adopted = [{"name": "tf32", "speedup": 1.6}, {"name": "bf16-autocast", "speedup": 2.1},
               {"name": "fused-optimizer", "speedup": 1.1}]
    assert [a["name"] for a in combination(adopted)] == ["bf16-autocast", "fused-optimizer"]
    assert combination([{"name": "tf32", "speedup": 1.6}]) == []


# ---- fixes and confirmed findings ---------------------------------------------------------------
def test_the_import_torch_line_is_found_by_reading_the_script(tmp_path):
    from torchdoctor.treat.fixes import import_torch_line

    p = tmp_path / "t.py"
    p.write_text('"""doc"""\nimport os\n\nimport torch.nn as nn\n')
    assert import_torch_line(p) == 4
    p.write_text("x = (\n")
    assert import_torch_line(p) is None


def test_an_adopted_trial_puts_its_ratio_in_the_finding_it_confirms():
    from torchdoctor.findings import Report, finding
    from torchdoctor.treat.confirm import confirm_findings

    r = Report(command="treat")
    r.add(finding("dataloader-bound", "waits", {"data_wait_share": 0.9}))
    r.add(finding("memory-fragmentation", "frag", {}))
    confirm_findings(r, [{"name": "dataloader-workers", "verdict": "adopt", "speedup": 1.8},
                         {"name": "expandable-segments", "verdict": "noise",
                          "peak_memory_before": 10, "peak_memory_after": 9}])
    assert r.findings[0].evidence["treat"] == {"dataloader-workers": 1.8}
    assert "treat" not in r.findings[1].evidence


def test_verdicts_are_the_documented_five():
    from torchdoctor.treat.verdict import VERDICTS

    assert VERDICTS == ("adopt", "noise", "reject", "failed", "skipped")


def test_a_reordering_treatment_of_a_bf16_script_is_held_to_the_bf16_tolerance():
    from torchdoctor.treat.plan import tolerance_for

    bf16_script = {"models": [{"dtypes": ["float32"], "autocast": True}]}
    assert tolerance_for(BY_NAME["compile"], bf16_script) == BF16
    assert tolerance_for(BY_NAME["compile"], SURVEY) == REORDER
    assert tolerance_for(BY_NAME["set-to-none"], bf16_script) == EXACT  # changes no arithmetic


# ---- a trial entry from synthetic runs ------------------------------------------------------------
def _run(step_ms, losses=None, treatment=None, result=None, errors=(), peak=None):
    from torchdoctor.evidence import Evidence
    from torchdoctor.trials import TrialRun, Variation

    ev = [{"kind": "step", "step": i, "wall_s": ms / 1e3, "data_s": 0.0} for i, ms in enumerate(step_ms, 1)]
    ev.append({"kind": "loss_trace", "steps": list(range(1, len(step_ms) + 1)),
               "losses": losses or [1.0 / i for i in range(1, len(step_ms) + 1)]})
    ev.append({"kind": "peak_memory", "host_rss": peak or 100 * 2**20})
    if treatment is not None:
        ev.append({"kind": "treatment", **treatment})
    ev += [{"kind": "treatment_error", "name": "x", "error": e} for e in errors]
    return TrialRun(Variation("v"), 0, Evidence.from_events(ev, meta={"argv": ["t.py"]},
                                                           result=result or {"outcome": "stopped"}), 1.0)


CHANGED = {"applied": [{"name": "compile", "changes": [{"what": "model", "where": "/x/t.py:7",
                                                        "code": "model.compile()"}], "notes": []}]}


def test_a_compile_trial_leaves_the_compile_steps_out_and_reports_the_compile_time():
    from torchdoctor.treat.measure import trial_entry

    base = [_run([99] + [10.0] * 9), _run([99] + [10.2] * 9)]
    # eager step 2, compiling in steps 3-4, then 5 ms
    t = {**CHANGED, "compile_steps": [3, 4], "compile_s": 12.5}
    treated = [_run([99, 10, 4000, 900] + [5.0] * 6, treatment=t),
               _run([99, 10, 3000, 800] + [5.1] * 6, treatment=t)]
    e = trial_entry("compile", "model.compile()", base, treated, tolerance=REORDER, intent="speed")
    assert e["treated_step_ms"] == pytest.approx(5.05) and e["speedup"] == pytest.approx(10.1 / 5.05, abs=1e-3)
    assert e["verdict"] == "adopt" and e["compile_s"] == 12.5 and e["compile_steps"] == [3, 4]
    assert e["where"] == ["/x/t.py:7"] and "compile: at /x/t.py:7: model.compile()" in e["fix"]
    assert e["loss_ok"] is True and e["loss_max_rel_diff"] == 0.0


def test_a_compile_trial_whose_runs_compiled_no_graph_measured_nothing_and_says_so():
    # llm.c's train_gpt2.py on an H200 (session 13): the trial's compile took 0.15 s and its
    # steps ran at the baseline's speed ("noise, 1.00x"), while the same model compiled by the
    # script ran 2.2x faster after a 41 s compile. A trial run whose dynamo counters show no
    # graph ran eager: it is not a verdict on compile
    from torchdoctor.treat.measure import trial_entry

    base = [_run([99] + [10.0] * 9), _run([99] + [10.2] * 9)]
    eager = {**CHANGED, "compile_steps": [3], "compile_s": 0.15,
             "dynamo": {"frames": 2, "frames_ok": 0, "graphs": 0, "ops_captured": 0, "graph_breaks": 0}}
    treated = [_run([99] + [10.1] * 9, treatment=eager)] * 2
    e = trial_entry("compile", "model.compile()", base, treated, tolerance=REORDER, intent="speed")
    assert e["verdict"] == "skipped" and e["reason"].startswith("the model ran eager in the trial")
    assert "0 graphs" in e["reason"] and e["dynamo"]["graphs"] == 0
    compiled = {**eager, "compile_s": 12.5, "dynamo": {**eager["dynamo"], "frames_ok": 6, "graphs": 1,
                                                         "ops_captured": 453}}
    treated = [_run([99, 10, 4000] + [5.0] * 7, treatment=compiled)] * 2
    e = trial_entry("compile", "model.compile()", base, treated, tolerance=REORDER, intent="speed")
    assert e["verdict"] == "adopt"


def test_a_treatment_that_raised_is_failed_and_one_that_changed_nothing_is_skipped():
    from torchdoctor.treat.measure import trial_entry

    base = [_run([9] + [10.0] * 5), _run([9] + [10.0] * 5)]
    e = trial_entry("tf32", "", base, [_run([9] + [5.0] * 5, treatment=CHANGED, errors=["RuntimeError: no"])],
                    tolerance=TF32, intent="speed")
    assert (e["verdict"], e["error"]) == ("failed", "the treatment raised: RuntimeError: no")
    quiet = {"applied": [{"name": "fused-optimizer", "changes": [], "notes": ["Adam: not fused (x)"]}]}
    e = trial_entry("fused-optimizer", "", base, [_run([9] + [10.0] * 5, treatment=quiet)] * 2,
                    tolerance=REORDER, intent="speed")
    assert e["verdict"] == "skipped" and e["reason"] == "nothing to change in this run: Adam: not fused (x)"


def test_random_augmentation_in_the_main_process_is_not_compared_loss_for_loss():
    from torchdoctor.treat.measure import trial_entry

    base = [_run([9] + [20.0] * 5), _run([9] + [20.0] * 5)]
    changed = {"applied": [{"name": "dataloader-workers", "changes": [{"what": "DataLoader",
                                                                      "where": "t.py:3", "code": "x"}]}]}
    treated = [_run([9] + [10.0] * 5, losses=[2.0] * 6, treatment=changed)] * 2
    e = trial_entry("dataloader-workers", "", base, treated, tolerance=EXACT, intent="speed",
                    survey={"rng_in_fetch": True})
    assert e["loss_ok"] is None and "per-worker seeds" in e["loss_note"] and e["verdict"] == "adopt"
    e = trial_entry("dataloader-workers", "", base, treated, tolerance=EXACT, intent="speed")
    assert e["loss_ok"] is False and e["verdict"] == "reject"


def test_the_console_shows_the_table_the_fix_and_untrusted_text_made_visible():
    from torchdoctor.findings import Report
    from torchdoctor.report.console import render_to_text
    from torchdoctor.treat.measure import skipped_entry, trial_entry

    base = [_run([9] + [20.0] * 5), _run([9] + [20.4] * 5)]
    changed = {"applied": [{"name": "dataloader-workers", "changes": [
        {"what": "DataLoader", "where": "/x/t\x1b[31m.py:3", "code": "DataLoader(..., num_workers=2)"}]}]}
    good = trial_entry("dataloader-workers", "num_workers=2", base, [_run([9] + [10.0] * 5, treatment=changed)] * 2,
                       tolerance=EXACT, intent="speed")
    r = Report(command="treat", target="t.py")
    r.metrics = {"trials": [good, skipped_entry("tf32", "no CUDA")],
                 "treat": {"runs": 4, "rounds": 2, "wall_s": 9.0, "stopped": "budget", "budget_s": 10.0}}
    text = render_to_text(r, width=120)
    assert "dataloader-workers │ adopt" in text and "20.2 → 10" in text and "2.02x" in text
    assert "Adopt dataloader-workers (2.02x)" in text and "num_workers=2)" in text
    assert "\\x1b[31m" in text and "\x1b" not in text
    assert "Not tried: tf32 (no CUDA)" in text and "--budget (10 s) reached" in text


@pytest.mark.parametrize("args, message", [
    (["--try", "tf23", "x.py"],
     "unknown treatment 'tf23' (did you mean tf32?); `torchdoctor treat --list` lists them"),
    (["--budget", "1", "x.py"], "--budget must be at least 5 seconds (one run), not 1"),
    (["nope.py"], "script not found: nope.py"),
    ([], "missing SCRIPT (or -m MODULE)"),
])
def test_bad_usage_is_one_line_and_exit_2_before_any_run(tmp_path, cli_inproc, args, message):
    (tmp_path / "x.py").write_text("print('ran')\n")
    p = cli_inproc("treat", *args, cwd=tmp_path)  # in-process: a run started fails the test (conftest)
    assert p.returncode == 2 and p.stdout == "" and "ran" not in p.stderr
    assert p.stderr.splitlines()[0] == f"torchdoctor: error: {message}"


def test_list_prints_the_catalogue_without_running_anything(cli_inproc):
    p = cli_inproc("treat", "--list", "--json")  # in-process: a run started fails the test
    assert p.returncode == 0
    import json

    rows = json.loads(p.stdout)["catalogue"]
    assert [r["name"] for r in rows] == [t.name for t in CATALOGUE]
    assert rows[2]["device"] == "cuda" and rows[2]["loss_tolerance"] == TF32


def _cuda_run(host_ms, span_ms, window=None, treatment=None):
    """A CUDA trial run: host walls, device spans per step, optionally its synchronised window."""
    r = _run(host_ms, treatment=treatment)
    ev = r.evidence
    extra = [{"kind": "step_device", "step": i, "device": 0, "span_ms": s}
             for i, s in enumerate(span_ms, 1) if s is not None]
    if window is not None:
        extra.append({"kind": "trial_window", **window})
    from torchdoctor.evidence import Evidence
    from torchdoctor.trials import TrialRun, Variation

    return TrialRun(Variation("v"), 0, Evidence.from_events(ev.events + extra, meta=ev.meta,
                                                           result=ev.result), 1.0)


def test_a_cuda_trial_whose_host_runs_ahead_is_timed_by_the_device():
    # regression (H200, fp32 MLP): with fused AdamW the host never waited for the GPU within 30
    # steps (6.9 ms/step host) while the GPU took ~111 ms a step; treat adopted it at 16.2x
    from torchdoctor.treat.measure import trial_entry

    base = [_cuda_run([200] + [112.0] * 9, [None] + [112.5] * 9),
            _cuda_run([200] + [113.0] * 9, [None] + [113.0] * 9)]
    treated = [_cuda_run([200] + [6.9] * 9, [None] + [111.0] * 9, treatment=FUSED),
               _cuda_run([200] + [7.0] * 9, [None] + [111.5] * 9, treatment=FUSED)]
    assert treated[0].median_ms() == pytest.approx(111.0)
    e = trial_entry("fused-optimizer", "fused=True", base, treated, tolerance=REORDER, intent="speed")
    assert e["speedup"] == pytest.approx(112.75 / 111.25, abs=1e-3) and e["verdict"] == "noise"
    assert e["fix"] == ""


def test_a_synchronised_window_is_the_run_step_time_unless_it_holds_an_excluded_step():
    w = {"from_step": 3, "to_step": 10, "steps": 8, "wall_s": 0.8}
    r = _cuda_run([200] + [6.9] * 9, [None] + [90.0] * 9, window=w)
    assert r.median_ms() == pytest.approx(100.0)  # 0.8 s / 8 steps, not the per-step figures
    assert r.window() is not None and "synchronised" in r.time_basis()
    assert r.median_ms(exclude={5}) == pytest.approx(90.0)  # a compile step inside: per step
    assert "device span" in r.time_basis(exclude={5})


FUSED = {"applied": [{"name": "fused-optimizer", "changes": [{"what": "optimizer", "where": "/x/t.py:9",
                                                              "code": "fused=True"}], "notes": []}]}


def test_a_trial_measured_slower_or_within_noise_is_withdrawn_from_other_findings_fixes():
    # regression (Lightning script on CPU): workers measured 0.66x and were still the first fix
    # of dataloader-bound
    from torchdoctor.findings import Report, finding
    from torchdoctor.treat.confirm import confirm_findings

    r = Report(command="treat")
    r.add(finding("dataloader-bound", "waits", {"data_wait_share": 0.9},
                  fix="Load in parallel: DataLoader(num_workers=2, persistent_workers=True); "
                      "Make DS.__getitem__ cheaper: cache"))
    r.add(finding("pageable-h2d-copy", "copies", {}, fix="pin_memory=True with non_blocking"))
    confirm_findings(r, [{"name": "dataloader-workers", "verdict": "reject", "speedup": 0.66,
                          "noise_band": 0.05, "reason": "slower: 0.66x (noise band ±5%)"},
                         {"name": "pin-memory", "verdict": "failed", "speedup": None}])
    f = r.findings[0]
    assert "num_workers" not in f.fix and f.fix == "Make DS.__getitem__ cheaper: cache"
    assert f.evidence["treat_not_a_fix"]["dataloader-workers"].startswith("0.66x")
    assert r.findings[1].fix == "pin_memory=True with non_blocking"  # not measured: kept
    # within noise is withdrawn too; a loss rejection of a faster trial is not a timing verdict
    r2 = Report(command="treat")
    r2.add(finding("dataloader-bound", "w", {}, fix="Load in parallel: DataLoader(num_workers=2)"))
    confirm_findings(r2, [{"name": "dataloader-workers", "verdict": "noise", "speedup": 1.01,
                           "noise_band": 0.02, "reason": "within noise"}])
    assert r2.findings[0].fix == ""
    r3 = Report(command="treat")
    r3.add(finding("dataloader-bound", "w", {}, fix="Load in parallel: DataLoader(num_workers=2)"))
    confirm_findings(r3, [{"name": "dataloader-workers", "verdict": "reject", "speedup": 1.9,
                           "noise_band": 0.02, "reason": "loss drift"}])
    assert "num_workers" in r3.findings[0].fix


def test_a_treatment_the_script_undid_is_skipped_not_judged_as_noise():
    # found by the GPU truth harness (H200): a conv script that assigns cudnn.benchmark = False
    # itself got "noise 1.00x" for cudnn-benchmark while the change made by hand gave 1.16x
    from torchdoctor.treat.measure import trial_entry

    base = [_run([99] + [10.0] * 9), _run([99] + [10.1] * 9)]
    t = {"applied": [{"name": "cudnn-benchmark", "changes": [{"what": "flag", "where": None,
                                                              "code": "torch.backends.cudnn.benchmark = True"}],
                      "notes": ["the script sets torch.backends.cudnn.benchmark itself after the treatment set it"],
                      "overridden": "the script sets torch.backends.cudnn.benchmark itself after the "
                                    "treatment set it: the run did not measure it"}]}
    treated = [_run([99] + [10.0] * 9, treatment=t), _run([99] + [10.05] * 9, treatment=t)]
    e = trial_entry("cudnn-benchmark", "benchmark", base, treated, tolerance=REORDER, intent="speed")
    assert e["verdict"] == "skipped" and "did not measure it" in e["reason"] and e["fix"] == ""
