"""Issue 13 (training/perf rules): regressions on fixtures written in the style of real scripts.

Items: 5 (sampler epochs judged by the iterators that fed steps), 6 (data wait attributed to the
loader that fed the steps; transforms are not models), 11 (file:line for missing-zero-grad,
eval-mode-training, params-not-in-optimizer), 16 (one statistic in the step table),
18 (profile hotspots name the function's definition line).
"""

from __future__ import annotations

from torchdoctor.instruments.profile._profile_analysis import Sources, analyze

US = 1000  # ns

# --------------------------------------------------------------------------- item 18
# A script in the style of pytorch/examples: the loop lives in train(); the profiler window opens
# while train() is already running, so the tracer names it with the line *then running*.
TRAIN_PY = '''import torch


def tokenize(text):
    return [ord(c) % 97 for c in text]


@torch.no_grad()
def evaluate(model):
    return 0.0


def train(model, opt, data):
    for step, (x, y) in enumerate(data):
        ids = tokenize("a sentence" * 8)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    train(None, None, [])
'''.splitlines()


def _src() -> Sources:
    return Sources(is_user=lambda f: f == "train.py", show=lambda f: f,
                   code=lambda f, n: TRAIN_PY[n - 1].strip() if f == "train.py" and 0 < n <= len(TRAIN_PY) else "")


def _flat_with_running_frames() -> dict:
    nodes: list = []

    def node(parent, tag, name, start, end, **extra):
        nodes.append([len(nodes), parent, tag, name, 1, start * US, end * US, extra])
        return len(nodes) - 1

    for i, t in enumerate((0, 2000, 4000)):
        s = node(-1, "op", f"ProfilerStep#{i + 1}", t, t + 2000, corr=i + 1, user=True, **{"in": []})
        # frames already running when the window opened: named with their running line
        mod = node(s, "py", "train.py(23): <module>", t, t + 1900, file="train.py", line=23, func="<module>")
        loop = node(mod, "py", "train.py(18): train", t + 10, t + 1890, file="train.py", line=23, func="train")
        # a function called inside the window: named with its def line by the tracer
        node(loop, "py", "train.py(4): tokenize", t + 20, t + 820, file="train.py", line=15, func="tokenize")
        node(loop, "py", "train.py(10): evaluate", t + 900, t + 1000, file="train.py", line=16,
             func="evaluate")
        node(loop, "op", "aten::addmm", t + 1000, t + 1100, corr=100 + i, **{"in": []})
    return {"version": 1, "nodes": nodes, "device": [], "runtime": []}


def test_python_hotspots_name_the_definition_line_not_the_running_line():
    hot = {h["func"]: h["def"] for h in analyze(_flat_with_running_frames(), _src())["profile_python"]["functions"]}
    assert hot["train"] == "train.py:13"  # def train(...), not line 18 (opt.step() then running)
    assert hot["<module>"] == "train.py:1"
    assert hot["tokenize"] == "train.py:4"
    assert hot["evaluate"] == "train.py:8"  # a decorated function is defined at its decorator


def test_def_line_keeps_the_line_when_the_source_is_unknown():
    src = Sources(is_user=lambda f: True)
    assert src.def_line("train.py", 18, "train") == 18
    assert src.def_line("train.py", 7, "<lambda>") == 7


# --------------------------------------------------------------------------- item 11
import pytest  # noqa: E402

from test_nan_fixtures import SCRIPTS, by_code, codes, judge  # noqa: E402

RW = SCRIPTS / "training" / "realworld"


def _line_of(script, marker: str) -> str:
    n = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if marker in t)
    return f"{script.name}:{n}"


def test_missing_zero_grad_names_the_optimizer_and_the_step_line():
    script = RW / "finetune_three_bugs.py"  # three independent bugs, one run
    r = judge("checkup", script)
    assert "missing-zero-grad" in codes(r)
    f = by_code(r, "missing-zero-grad")
    assert f.evidence["optimizer_built_at"].endswith(_line_of(script, "# OPTIMIZER LINE"))
    assert f.evidence["step_called_at"].endswith(_line_of(script, "# STEP LINE"))
    assert _line_of(script, "# STEP LINE") in f.title


def test_eval_mode_training_names_the_eval_call():
    script = RW / "finetune_three_bugs.py"  # three independent bugs, one run
    r = judge("checkup", script)
    assert "eval-mode-training" in codes(r)
    f = by_code(r, "eval-mode-training")
    assert f.evidence["eval_called_at"].endswith(_line_of(script, "# EVAL LINE"))
    assert _line_of(script, "# EVAL LINE") in f.title


def test_params_not_in_optimizer_names_where_the_module_was_built():
    script = RW / "finetune_three_bugs.py"  # three independent bugs, one run
    r = judge("checkup", script)
    assert "params-not-in-optimizer" in codes(r)
    f = by_code(r, "params-not-in-optimizer")
    [(site, params)] = f.evidence["created_at"].items()
    assert site.endswith(_line_of(script, "# HEAD LINE"))
    assert sorted(p.split(".")[-1] for p in params) == ["bias", "weight"]
    assert _line_of(script, "# HEAD LINE") in f.title


def test_module_sites_leave_nothing_on_the_model_and_it_still_copies():
    """The sites are kept aside: an instrumented model pickles and deepcopies as without us."""
    import copy
    import io

    import torch

    from torchdoctor.instruments._sites import SiteBook, creation_site

    book = SiteBook()
    m = torch.nn.Linear(2, 2)
    book.put(m, creation_site(m, 1))
    assert book.get(m).endswith(".py:" + str(book.get(m).rsplit(":", 1)[1]))
    assert set(vars(m)) == set(vars(torch.nn.Linear(2, 2)))
    copy.deepcopy(m)
    torch.save(m, io.BytesIO())
    assert book.get(copy.deepcopy(m)) is None


# --------------------------------------------------------------------------- item 6
PERF = SCRIPTS / "perf"


def test_dataloader_bound_names_the_training_loop_and_transforms_are_not_models():
    script = PERF / "imagenet_style_eval.py"
    from torchdoctor.evidence.steps import step_summary
    from test_nan_fixtures import run_inprocess

    ev = run_inprocess("checkup", script, options={"steps": 16})
    assert [m["cls"] for m in ev.of("model")] == ["Sequential", "CrossEntropyLoss"]
    s = step_summary(ev)
    # the transform's time inside __getitem__ is data wait only, not also forward: no overlap
    assert "phase_overlap_ms" not in s, s
    assert sum(s["share"].values()) == pytest.approx(1.0, abs=0.01)
    assert sum(s["mean_ms"].values()) == pytest.approx(s["mean_step_ms"], rel=0.01)

    from torchdoctor.findings import Report
    from torchdoctor.judge import judge

    report = Report(command="checkup", target=str(script))
    judge("checkup", ev, report)
    f = by_code(report, "dataloader-bound")
    assert f.evidence["loop"].endswith(_line_of(script, "# TRAIN LOOP")), f.evidence
    assert _line_of(script, "# TRAIN LOOP") in f.title
    assert "FolderOfImages.__getitem__" in f.evidence["slowest_stage"]
    assert f.evidence["batch_size"] == 8
    assert len(f.evidence["data_wait_ms_per_step_by_loader"]) == 2


# --------------------------------------------------------------------------- item 16
def _skewed_steps():
    """Steps whose median wall is far from the mean (a slow step every 4th: a data stall)."""
    from torchdoctor.evidence import Evidence

    events = []
    for n in range(1, 14):
        data = 0.030 if n % 4 == 0 else 0.001
        events.append({"kind": "step", "step": n, "wall_s": data + 0.009, "data_s": data,
                       "forward_s": 0.004, "backward_s": 0.003, "optimizer_s": 0.001,
                       "other_s": 0.001, "batches": 1, "backwards": 1, "source": "optimizer"})
    return Evidence.from_events(events, meta={}, result={"outcome": "exit"})


def test_step_table_uses_one_statistic_and_says_which():
    import re

    from rich.console import Console

    from torchdoctor.findings import Report
    from torchdoctor.evidence.steps import step_summary
    from torchdoctor.report.sections.steps import step_breakdown

    m = step_summary(_skewed_steps())
    assert m["median_step_ms"] != pytest.approx(m["mean_step_ms"], rel=0.1)
    report = Report(command="checkup", target="train.py")
    report.metrics["steps"] = m
    con = Console(record=True, width=140, color_system=None)
    con.print(step_breakdown(report))
    text = con.export_text()
    head = re.search(r"mean ([\d.]+)\s+ms/step\s+\(median\s+([\d.]+),\s+p90", text)
    assert head, text
    assert float(head.group(1)) == pytest.approx(m["mean_step_ms"], rel=0.01)
    assert "mean ms/step" in text
    rows = [float(x) for x in re.findall(r"^\s*(?:data wait|forward|backward|optimizer|other)\W+([\d.]+)",
                                         text, re.M)]
    assert len(rows) == 5 and sum(rows) == pytest.approx(float(head.group(1)), rel=0.02)


# --------------------------------------------------------------------------- do no harm
def test_healthy_script_with_snapshots_is_silent_and_every_patch_is_undone():
    import torch
    from torch.utils.data import dataloader as dl

    before = (torch.nn.Module.__init__, torch.nn.Module.train, torch.optim.Optimizer.__init__,
              dl.DataLoader.__init__, dl._BaseDataLoaderIter.__init__, dl._BaseDataLoaderIter.__next__)
    r = judge("checkup", RW / "healthy_ema_snapshot.py", options={"steps": 40})
    assert codes(r) - {"cpu-oversubscribed"} == set(), [(f.code, f.title) for f in r.findings]
    assert not [f for f in r.findings if f.code in ("script-crashed", "internal-error")]
    after = (torch.nn.Module.__init__, torch.nn.Module.train, torch.optim.Optimizer.__init__,
             dl.DataLoader.__init__, dl._BaseDataLoaderIter.__init__, dl._BaseDataLoaderIter.__next__)
    assert after == before


@pytest.mark.slow
def test_profile_hotspot_of_a_running_main_is_defined_at_its_def_line():
    import json

    from conftest import run_cli

    script = SCRIPTS / "profile" / "cpu_loop_in_main.py"
    p = run_cli("profile", "--json", script, timeout=300)
    rep = json.loads(p.stdout)
    hot = {h["func"]: h["def"] for h in rep["metrics"]["profile"]["python_hotspots"]}
    assert hot["main"].endswith(_line_of(script, "# MAIN DEF")), hot


def test_shares_add_up_even_when_phases_nest():
    """LBFGS-style closure: forward and backward run inside optimizer.step()."""
    from torchdoctor.evidence import Evidence
    from torchdoctor.evidence.steps import step_summary

    events = [{"kind": "step", "step": n, "wall_s": 0.010, "data_s": 0.001, "forward_s": 0.003,
               "backward_s": 0.004, "optimizer_s": 0.008, "other_s": 0.0, "batches": 1,
               "backwards": 1, "source": "optimizer"} for n in range(1, 8)]
    m = step_summary(Evidence.from_events(events, meta={}, result={"outcome": "exit"}))
    assert sum(m["share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert m["phase_overlap_ms"] == pytest.approx(6.0)
