"""`torchdoctor repro`: comparisons on numbers, the rules on synthetic evidence, the CPU fixtures
end to end (the session's cached runs of tests/fixtures/scripts/repro/), the op-trace engines
and do-no-harm."""

from __future__ import annotations

import pickle
import random
import textwrap
from pathlib import Path

import pytest

from fixture_runs import run_fixture
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.judge import judge
from torchdoctor.reprocheck.ops import first_divergent_op
from torchdoctor.reprocheck.rng import compare_generators
from torchdoctor.reprocheck.steps import by_step, describe, first_divergence


# ---------------------------------------------------------------- steps (pure)
def _fp(step: int, **kinds) -> dict:
    return {"kind": "fingerprint", "step": step, "kinds": kinds}


def test_identical_fingerprints_and_losses_are_identical():
    ev = [_fp(1, batch=[["batch0[0]", 1.0, 2.0, 3.0]], grad=[["w", 0.5, 0.25, 0.5]]),
          _fp(2, batch=[["batch0[0]", 1.5, 2.0, 3.0]])]
    div, n = first_divergence(by_step(ev), by_step(ev), [1.0, 0.9], [1.0, 0.9])
    assert div is None and n == 2


def test_the_first_divergence_is_the_earliest_kind_of_the_earliest_step():
    a = [_fp(1, batch=[["b", 1.0, 1.0, 1.0]], forward=[["model", 2.0, 4.0, 2.0]]),
         _fp(2, batch=[["b", 1.0, 1.0, 1.0]], forward=[["model", 2.0, 4.0, 2.0]],
             grad=[["model.0.weight", 1.0, 1.0, 1.0], ["model.2.weight", 1.0, 1.0, 1.0]])]
    b = [_fp(1, batch=[["b", 1.0, 1.0, 1.0]], forward=[["model", 2.0, 4.0, 2.0]]),
         _fp(2, batch=[["b", 1.0, 1.0, 1.0]], forward=[["model", 2.0, 4.0, 2.0]],
             grad=[["model.0.weight", 1.0, 1.0, 1.5], ["model.2.weight", 1.0, 1.0, 1.5]])]
    div, n = first_divergence(by_step(a), by_step(b), [1.0, 0.5], [1.0, 0.5])
    assert (div["step"], div["what"], n) == (2, "grad", 2)
    assert div["names"] == ["model.2.weight", "model.0.weight"]  # closest to the loss first
    assert describe(div) == "gradient of parameter model.2.weight (and 1 more)"


def test_what_diverged_is_said_for_people():
    assert describe({"what": "batch", "names": ["batch0[0]", "batch0[1]"], "count": 2}) == \
        "data batch: batch0[0] (and 1 more)"
    assert describe({"what": "init", "names": ["m.weight"], "count": 1}) == "initial value of parameter m.weight"
    assert describe({"what": "forward", "names": ["model"], "count": 1}) == "forward output of module model"
    assert describe({"what": "update", "names": ["w"], "count": 1}) == "optimizer update of parameter w"


def test_a_loss_difference_counts_after_equal_forward_outputs():
    ev = [_fp(1, forward=[["model", 2.0, 4.0, 2.0]])]
    div, _ = first_divergence(by_step(ev), by_step(ev), [1.0], [1.0000001])
    assert div["what"] == "loss" and describe(div) == "loss"


def test_one_bit_of_one_value_is_a_divergence():
    x = 0.1
    y = 0.1 + 2 ** -56  # the next float64 above 0.1
    assert x != y
    a, b = [_fp(1, update=[["w", x, 1.0, 1.0]])], [_fp(1, update=[["w", y, 1.0, 1.0]])]
    div, _ = first_divergence(by_step(a), by_step(b), [], [])
    assert div["what"] == "update"


def test_different_tensors_seen_is_a_structural_divergence():
    a, b = [_fp(1, batch=[["b0", 1.0, 1.0, 1.0]])], [_fp(1, batch=[["b0", 1.0, 1.0, 1.0], ["b1", 1.0, 1.0, 1.0]])]
    div, _ = first_divergence(by_step(a), by_step(b), [], [])
    assert div["structure"] == {"only_a": [], "only_b": ["b1"]}


# ---------------------------------------------------------------- ops (pure)
def _trace(*ops) -> dict:
    return {"ops": [list(o) for o in ops], "strings": ["", "model.lin", "train.py:12"]}


def test_first_divergent_op_kinds():
    same = ("aten::addmm", "forward", 1, 2, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0], "")
    nd_a = ("aten::index_add_", "forward", 1, 2, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0], "")
    nd_b = ("aten::index_add_", "forward", 1, 2, [1.0, 1.0, 1.0], [3.0, 3.0, 3.1], "")
    op = first_divergent_op(_trace(same, nd_a), _trace(same, nd_b))
    assert op == {"op": "aten::index_add_", "phase": "forward", "module": "model.lin",
                  "where": "train.py:12", "index": 1, "kind": "nondeterministic", "inputs_equal": True}
    drop_a = ("aten::native_dropout", "forward", 1, 2, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0], "a1")
    drop_b = ("aten::native_dropout", "forward", 1, 2, [1.0, 1.0, 1.0], [2.0, 3.0, 3.0], "a1")
    assert first_divergent_op(_trace(drop_a), _trace(drop_b))["kind"] == "random"
    scal_b = ("aten::index_add_", "forward", 1, 2, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0], "other")
    assert first_divergent_op(_trace(nd_a), _trace(scal_b))["kind"] == "inputs"  # a number arg
    other = ("aten::mul", "forward", 1, 2, [1.0, 1.0, 1.0], [3.0, 3.0, 3.0], "")
    assert first_divergent_op(_trace(nd_a), _trace(other))["kind"] == "control-flow"
    assert first_divergent_op(_trace(same), _trace(same, same))["kind"] == "control-flow"
    assert first_divergent_op(_trace(same), _trace(same)) is None
    assert first_divergent_op(None, _trace(same))["kind"] == "unavailable"


# ---------------------------------------------------------------- generators (pure)
def _rng(np_state, np_draws, py_state="p", torch_states=("t", "t"), loaders=(), fresh=()):
    return {"steps": [1, 2], "start": {"python": "p0", "numpy": "n0", "torch": "t0", "cuda": None},
            "states": {"python": [py_state, py_state], "numpy": list(np_state),
                       "torch": list(torch_states), "cuda": [None, None]},
            "draws_by_step": {"python": [0, 0], "numpy": list(np_draws)},
            "sites": {"numpy": [{"where": "train.py:22", "fn": "numpy.random.normal", "count": 8}]},
            "loaders": list(loaders), "unseeded_generators": list(fresh)}


def test_a_generator_that_differs_and_was_drawn_from_is_implicated():
    imp, ruled = compare_generators(_rng("ab", [8, 16], py_state="x"), _rng("cd", [8, 16], py_state="y"), 1)
    assert [g["generator"] for g in imp] == ["numpy"]
    assert imp[0]["draws"] == 8 and imp[0]["sites"][0]["where"] == "train.py:22"
    why = {g["generator"]: g["why"] for g in ruled}
    assert why["python"] == "its state differed but nothing drew from it"
    assert why["torch"] == "same state in both runs" and why["cuda"] == "not in use"


def test_torch_generator_loader_seeds_and_unseeded_default_rng():
    a = _rng("aa", [0, 0], torch_states=("t1", "t2"), loaders=[{"base_seed": 1, "where": "x.py:3"}],
             fresh=[{"where": "x.py:9", "count": 1}])
    b = _rng("aa", [0, 0], torch_states=("u1", "u2"), loaders=[{"base_seed": 2, "where": "x.py:3"}],
             fresh=[{"where": "x.py:9", "count": 1}])
    imp, _ = compare_generators(a, b, 2)
    assert [g["generator"] for g in imp] == ["torch", "dataloader-workers", "numpy-default-rng"]


# ---------------------------------------------------------------- rules (synthetic evidence)
def _judged(**compare) -> Report:
    report = Report("repro")
    judge("repro", Evidence.from_events([{"kind": "repro_compare", "compared": True, **compare}]), report)
    return report


DIVERGED = {"identical": False, "first_divergent_step": 3, "steps_compared": 3,
            "diverged": {"step": 3, "what": "forward", "description": "forward output of module model"}}


def test_torchs_generator_is_named_with_the_op_that_drew_from_it():
    gen = {"implicated": [{"generator": "torch", "label": "torch CPU generator", "first_step": 1}],
           "ruled_out": []}
    r = _judged(**DIVERGED, generators=gen,
                first_divergent_op={"kind": "random", "op": "aten::uniform_", "where": "t.py:3"})
    assert [f.code for f in r.findings] == ["unseeded-rng"]
    assert r.findings[0].title.endswith("first draw at t.py:3 (aten::uniform_)")
    assert "torch.manual_seed" in r.findings[0].fix


def test_identical_runs_raise_nothing():
    assert _judged(identical=True, steps_compared=20).findings == []


def test_runs_not_compared_are_skipped_not_healthy():
    report = Report("repro")
    judge("repro", Evidence.from_events([{"kind": "repro_compare", "compared": False}]), report)
    assert report.findings == [] and {s.rule for s in report.skipped} >= {"unseeded-rng"}


def test_each_cause_raises_its_code():
    gen = {"implicated": [{"generator": "python", "label": "Python random (global)",
                           "sites": [{"where": "s.py:19", "fn": "random.shuffle"}]}], "ruled_out": []}
    r = _judged(**DIVERGED, generators=gen, first_divergent_op={"kind": "inputs", "op": "aten::select"})
    assert [f.code for f in r.findings] == ["unseeded-rng"]
    assert "Python random (global)" in r.findings[0].title and "s.py:19" in r.findings[0].title
    op = {"kind": "nondeterministic", "op": "aten::index_add_", "module": "model.mp", "where": "t.py:30"}
    det = {"reproducible": True, "cost": 1.31, "median_step_ms": 13.1, "baseline_median_step_ms": 10.0}
    r = _judged(**DIVERGED, generators={"implicated": [], "ruled_out": []}, first_divergent_op=op,
                deterministic=det)
    assert [f.code for f in r.findings] == ["nondeterministic-op"]
    f = r.findings[0]
    assert f.title.startswith("aten::index_add_ in model.mp at t.py:30")
    assert "1.31×" in f.fix and "use_deterministic_algorithms(True)" in f.fix
    r = _judged(**DIVERGED, generators={"implicated": [], "ruled_out": [
        {"label": "NumPy global (legacy) generator", "why": "same state in both runs"}]},
        first_divergent_op={"kind": "inputs", "op": "aten::mul", "where": "t.py:28"})
    assert [f.code for f in r.findings] == ["nondeterministic-run"]
    assert "NumPy global (legacy) generator: same state in both runs" in r.findings[0].evidence["ruled_out"]


# ---------------------------------------------------------------- the CPU fixtures end to end
def _repro(rel: str) -> tuple[dict, list]:
    run = run_fixture(f"repro/{rel}")
    return run.report["metrics"]["repro"], run.report["findings"]


def test_numpy_augmentation_without_a_seed_names_numpy_and_the_line():
    rep, findings = _repro("rng_numpy_augment.py")
    assert [f["code"] for f in findings] == ["unseeded-rng"]
    f = findings[0]
    assert "NumPy global (legacy) generator" in f["title"]
    assert "rng_numpy_augment.py:22 (numpy.random.normal)" in f["title"]
    assert rep["first_divergent_step"] == 1 and rep["diverged"]["what"] == "batch"
    assert rep["draws"]["a"]["numpy"] > 0 and rep["draws"]["a"]["python"] == 0
    assert {g["generator"] for g in rep["generators"]["implicated"]} == {"numpy"}


def test_python_shuffle_sampler_names_pythons_generator():
    rep, findings = _repro("rng_python_shuffle.py")
    assert [f["code"] for f in findings] == ["unseeded-rng"]
    assert "Python random (global)" in findings[0]["title"]
    assert "rng_python_shuffle.py:19 (random.shuffle)" in findings[0]["title"]
    op = rep["first_divergent_op"]
    assert op["kind"] == "inputs" and op["phase"] == "data"  # the batch was made of other rows


def test_seeded_script_with_workers_gives_identical_runs_and_no_warning():
    rep, findings = _repro("run_seeded_workers.py")
    assert findings == []
    assert rep["identical"] is True and rep["steps_compared"] == 4
    assert rep["losses"]["a"] == rep["losses"]["b"] and len(rep["losses"]["a"]) == 4
    assert "first_divergent_op" not in rep  # no localising pair for identical runs


def test_a_custom_op_with_run_dependent_order_is_a_nondeterministic_op():
    rep, findings = _repro("op_custom_nondeterministic.py")
    assert [f["code"] for f in findings] == ["nondeterministic-op"]
    op = rep["first_divergent_op"]
    assert op["op"] == "tdfixture::scatter_sum" and op["inputs_equal"] is True
    assert op["where"].endswith("op_custom_nondeterministic.py:31")
    det = rep["deterministic"]
    assert det["reproducible"] is False  # deterministic mode does not reach a custom op
    assert det["held_at_end"]["deterministic_at_end"] is True
    assert "still differed" in findings[0]["fix"]


def test_a_wall_clock_schedule_is_a_nondeterministic_run_with_what_was_ruled_out():
    rep, findings = _repro("run_wallclock_schedule.py")
    assert [f["code"] for f in findings] == ["nondeterministic-run"]
    ev = findings[0]["evidence"]
    assert ev["first_divergent_op"]["kind"] == "inputs"
    assert ev["first_divergent_op"]["where"].endswith("run_wallclock_schedule.py:29")
    assert any("same state in both runs" in r for r in ev["ruled_out"])


# ---------------------------------------------------------------- engines and do-no-harm
SEEDED = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8),
                                       torch.randn(64, 1)), batch_size=8, shuffle=True)
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


def test_fingerprints_leave_the_losses_bitwise_unchanged_and_both_op_engines_agree(tmp_path: Path):
    from torchdoctor.reprocheck.flow import REPRO_NEEDS, RUN_A, localise_variation
    from torchdoctor.torch_internals import debug_mode_class
    from torchdoctor.trials import BASELINE, Trials

    script = tmp_path / "train.py"
    script.write_text(SEEDED)
    with Trials("repro", str(script), [], options={"steps": 6, "timeout": 120}) as tr:
        plain = tr.run(BASELINE)
        measured = tr.run(RUN_A)
        dispatch = tr.run(localise_variation(2, "dispatch"), steps=2)
        debug = tr.run(localise_variation(2, "debug_mode"), steps=2) if debug_mode_class() else None
    assert plain.failure() is None and measured.failure() is None
    assert not plain.evidence.of("fingerprint") and len(measured.evidence.of("fingerprint")) == 6
    assert plain.losses() == measured.losses() and len(plain.losses()) == 6  # bitwise
    assert "fingerprint" in REPRO_NEEDS
    td = dispatch.evidence.last("op_trace")
    assert td["engine"] == "dispatch" and td["complete"] and not td["truncated"]
    names = [o[0] for o in td["ops"]]
    assert "aten::addmm" in names and not any(n.startswith("profiler::") for n in names)
    assert {"aten::bernoulli_", "aten::native_dropout"} & set(names)  # dropout drew
    if debug is not None:
        tdm = debug.evidence.last("op_trace")
        assert tdm["engine"] == "debug_mode"
        # the same ops with the same fingerprints, whichever engine hashed them
        assert first_divergent_op(td, tdm) is None, first_divergent_op(td, tdm)


def test_the_draw_counter_pickles_and_copies_as_the_original():
    import copy

    from torchdoctor.instruments.repro.rng_draws import Counted

    class Inst:
        live, pid = True, -1

    c = Counted(random.shuffle, "python", "random.shuffle", Inst())
    assert pickle.loads(pickle.dumps(c)).__self__ is not None
    assert copy.deepcopy(c) is not None and c.__name__ == "shuffle"
    xs = [1, 2, 3]
    c(xs)  # counts only in its own process (pid -1: never), draws as the original
    assert sorted(xs) == [1, 2, 3]


# ---------------------------------------------------------------- CLI and console
@pytest.mark.parametrize("argv, text", [
    (["repro", "--steps", "0", "x.py"], "--steps must be >= 1"),
    (["repro", "--op-engine", "magic", "x.py"], "--op-engine must be one of"),
    (["repro"], "missing SCRIPT"),
])
def test_bad_usage_is_exit_2(argv, text, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from torchdoctor.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("pass\n")
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and text in res.output


def test_console_shows_both_loss_curves_and_the_verdict():
    from torchdoctor.report.console import render_to_text

    report = Report("repro", target="t.py")
    report.metrics["repro"] = {
        "compared": True, "identical": False, "steps_compared": 3, "first_divergent_step": 12,
        "diverged": {"description": "gradient of parameter model.2.weight"},
        "first_divergent_op": {"op": "aten::index_add_", "module": "model.mp", "where": "t.py:30",
                               "kind": "nondeterministic", "inputs_equal": True},
        "deterministic": {"reproducible": True, "cost": 1.3, "median_step_ms": 13.0,
                          "baseline_median_step_ms": 10.0},
        "losses": {"a": [1.0 + i for i in range(12)], "b": [1.0 + i for i in range(11)] + [12.5]}}
    text = render_to_text(report)
    assert "Runs diverge at step 12: gradient of parameter model.2.weight" in text
    assert "aten::index_add_ in model.mp at t.py:30 (nondeterministic, same inputs)" in text
    assert "identical runs, step time ×1.3" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip()[:2].strip().isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5", "6", "7", "8", "12"]
    assert rows[-1][1:] == ["12", "12.5", "≠"] and rows[0][1:] == ["1", "1"]
