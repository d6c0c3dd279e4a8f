"""End to end on every headed fixture script, collected by glob (tests/fixture_runs.py).

Each fixture under tests/fixtures/scripts/ with a `# torchdoctor: COMMAND` header is run once
(the session cache: other tests that need the same run reuse it) with --json, and
- the exact set of `code@severity` it raises equals its `# expect:` header (host-load
  cpu-oversubscribed aside);
- its exit code, status and findings, each as (code, severity, identifying evidence keys), equal
  its findings-only expectation tests/golden/scripts/<path>.expect.json: no more, no fewer
  (tests/golden/expect.py says which keys; regenerate with
  `.venv/bin/python tests/golden/regen.py --findings PATH`, review the diff);
- for the few contract fixtures (fixture_runs.CONTRACT: one per probe), its normalised whole
  report also equals tests/golden/scripts/<path>.json (the JSON contract).
GPU-only fixtures (`# requires: cuda` / `2 gpus`) are skipped without CUDA and have no golden
(they are checked on their code set only). The checkpoint fixtures are compared the same way by
one test that audits them all in one process (tests/golden/ckpt_driver.py).

These tests run last (conftest.py); their runs, for the fixtures this session selected, start
at collection in a background lane while the other tests run, and the main thread joins in as
the second lane when it reaches them (FIXTURE_JOBS in all, default 2: CI's two cores; see
tests/fixture_lanes.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fixture_runs import CONTRACT, GOLDEN, dumps, headed_fixtures, launch, normalise, run_fixture

HERE = Path(__file__).resolve().parent
HEADS = headed_fixtures()
sys.path.insert(0, str(GOLDEN))
from expect import differences, expectation  # noqa: E402


def _marks(h):
    marks = []
    if h.skip:
        marks.append(pytest.mark.skip(reason=f"e2e: {h.skip}"))
    if h.gpus >= 2:
        marks.append(pytest.mark.multigpu)
    elif h.gpus == 1:
        marks.append(pytest.mark.gpu)
    return marks


PARAMS = [pytest.param(h, id=h.rel, marks=_marks(h)) for h in HEADS]


def expect_path(h) -> Path:
    return h.golden.with_name(h.golden.name[:-len(".json")] + ".expect.json")


def _whole_report_diff(golden: dict, got: dict) -> str:
    import difflib

    return "".join(difflib.unified_diff(dumps(golden).splitlines(True), dumps(got).splitlines(True),
                                        "golden", "this run", n=2))


def window_over_budget(report: dict) -> str | None:
    """Why the memory probe's site window stopped short of what it set out to record because of
    its own time budget, else None. Its budget is wall time (docs/memory.md): on a box loaded by
    other processes its steps slow down and the window stops, by design, and the growth is then
    reported unexplained (info). Such a run says nothing about the fixture."""
    sites = ((report.get("metrics") or {}).get("memory") or {}).get("sites") or {}
    over = [sites["cut"]] if sites.get("cut") else []
    over += [s for s in sites.get("skipped") or [] if "time budget" in s]
    return "; ".join(over) or None


@pytest.mark.parametrize("h", PARAMS)
def test_fixture_raises_its_header_and_matches_its_expectation(h):
    run = run_fixture(h.rel)
    if run.codes != h.expect and window_over_budget(run.report):
        # the load of the box, said in the report, not the fixture: one fresh run (seen in CI
        # on memory/leak_buffers.py at load 4-5: tracemalloc stopped, memory-growth info)
        run = launch(h, keep=True)
    sites = ((run.report.get("metrics") or {}).get("memory") or {}).get("sites")
    assert run.codes == h.expect, (
        f"{h.rel}: raised {sorted(run.codes)}, header says {sorted(h.expect)}; "
        + json.dumps([(f["code"], f["severity"], f["title"]) for f in run.report["findings"]])[:3000]
        + (f"; memory site window: {json.dumps({k: v for k, v in sites.items() if k not in ('tensor_sites', 'graph_growth')})[:1500]}"
           if sites else ""))
    if h.requires:
        return  # GPU fixtures: no golden (made on the GPU box, not here)
    path = expect_path(h)
    assert path.exists(), f"no expectation for {h.rel}: run .venv/bin/python tests/golden/regen.py {h.rel}"
    diff = differences(expectation(run.returncode, run.report), json.loads(path.read_text()))
    assert not diff, f"{h.rel} differs from {path.relative_to(HERE.parent)}:\n{diff[:6000]}"
    if f"scripts/{h.rel}" in CONTRACT:
        golden = json.loads(h.golden.read_text())
        got = {"exit": run.returncode, "codes": sorted(run.codes), "report": normalise(run.report)}
        if got != golden:
            pytest.fail(f"{h.rel} differs from its whole-report golden {h.golden.relative_to(HERE.parent)}:\n"
                        f"{_whole_report_diff(golden, got)[:6000]}")


def test_every_runnable_fixture_script_has_a_header():
    scripts = HERE / "fixtures" / "scripts"
    helpers = {"dist/_common.py", "dist/_lm.py", "perf/_gpu_net.py", "run/siblib.py"}
    headed = {h.rel for h in HEADS}
    for p in sorted(scripts.rglob("*.py")):
        rel = p.relative_to(scripts).as_posix()
        if rel in helpers or p.name == "__init__.py" or rel in {"run/modpkg/model.py", "proc/modproj/pkg/helper.py"}:
            continue
        assert rel in headed, f"{rel}: no `# torchdoctor:` header (or add it to the helpers here)"


def test_every_cpu_fixture_has_an_expectation_and_only_contract_fixtures_a_whole_report():
    cpu = [h for h in HEADS if not h.requires and not h.skip]
    expects = set((GOLDEN / "scripts").rglob("*.expect.json"))
    assert expects == {expect_path(h) for h in cpu}, (
        sorted(map(str, expects - {expect_path(h) for h in cpu})),
        sorted(map(str, {expect_path(h) for h in cpu} - expects)))
    reports = {p.relative_to(GOLDEN).as_posix()[:-len(".json")] for p in GOLDEN.rglob("*.json")
               if not p.name.endswith(".expect.json")}
    assert reports == set(CONTRACT), (sorted(reports - CONTRACT), sorted(CONTRACT - reports))


def test_expectations_agree_with_the_headers():
    """Without running anything: a fixture's expectation raises exactly its header's codes."""
    for h in HEADS:
        if h.requires or h.skip:
            continue
        want = json.loads(expect_path(h).read_text())
        codes = {f"{f['code']}@{f['severity']}" for f in want["findings"]}
        assert codes == h.expect, f"{h.rel}: expectation has {sorted(codes)}, header says {sorted(h.expect)}"


# Every probe and every metrics section a CPU fixture's report can have (docs/json.md), with
# the contract fixture(s) that keep its whole report.
PROBES = {"checkup", "profile", "memory", "nan", "repro", "compile", "dist", "gradcheck", "checkpoint-audit"}
SECTIONS = {"run", "steps", "memory", "nan", "followups", "profile", "flops", "repro", "compile", "ranks",
            "gradcheck", "checkpoint"}
TOP_LEVEL = {"artifacts", "command", "context", "findings", "metrics", "schema", "skipped", "status",
             "target", "tool", "version"}


def test_the_contract_goldens_cover_every_probe_section_and_top_level_key():
    reports = [json.loads((GOLDEN / f"{name}.json").read_text())["report"] for name in sorted(CONTRACT)]
    assert {r["command"] for r in reports} >= PROBES
    assert set().union(*(r["metrics"] for r in reports)) >= SECTIONS
    assert all(set(r) == TOP_LEVEL for r in reports), [sorted(set(r) ^ TOP_LEVEL) for r in reports]
    assert any(r["findings"] for r in reports) and any(r["artifacts"] for r in reports)
    for r in reports:  # the skipped rules: their entries' keys only (a new rule rewrites nothing)
        assert r["skipped"] == "<skipped: reason, rule>", r["skipped"]


def ckpt_expectations() -> dict[str, dict]:
    return {p.name[:-len(".expect.json")]: json.loads(p.read_text())
            for p in sorted((GOLDEN / "checkpoint").glob("*.expect.json"))}


def first_difference(a, b, path="") -> str:
    """Where two JSON values first differ, for a readable failure."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'got' if k in a else 'golden'}"
            if a[k] != b[k]:
                return first_difference(a[k], b[k], f"{path}/{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path}: got {str(a)[:300]!r}, golden {str(b)[:300]!r}"


def test_checkpoint_fixtures_match_their_expectations():
    pytest.importorskip("torch")
    sys.path.insert(0, str(GOLDEN))
    import ckpt_driver

    b = ckpt_driver.load_builders()  # the same module the checkpoint tests load (one build per session)
    raw = ckpt_driver.audit_all(b.cached("all"))
    want = ckpt_expectations()
    assert set(raw) == set(want)
    for name, r in raw.items():
        got = {"args": r["args"], **expectation(r["exit"], r["report"])}
        assert got["args"] == want[name]["args"], name
        diff = differences(got, want[name])
        assert not diff, f"checkpoint/{name} differs from its expectation (tests/golden/regen.py --ckpt):\n{diff}"
        if f"checkpoint/{name}" in CONTRACT:
            golden = json.loads((GOLDEN / "checkpoint" / f"{name}.json").read_text())
            whole = {"args": r["args"], "exit": r["exit"],
                     "codes": sorted(f"{f['code']}@{f['severity']}" for f in r["report"]["findings"]),
                     "report": normalise(r["report"])}
            assert whole == golden, (f"checkpoint/{name} differs from its whole-report golden: "
                                     f"{first_difference(whole, golden)}")


def test_a_site_window_stopped_by_its_time_budget_is_recognised():
    cut = {"metrics": {"memory": {"sites": {"cut": "the site window was cut after 1 of 4 steps to stay "
                                                   "within its time budget (0.5 s = ...)", "partial": True}}}}
    traced = {"metrics": {"memory": {"sites": {"skipped": [
        "Python-level sites (tracemalloc): stopped after 0.25 s, its share of the window's time budget"]}}}}
    assert "cut after 1 of 4" in window_over_budget(cut)
    assert "tracemalloc" in window_over_budget(traced)
    whole = {"metrics": {"memory": {"sites": {"python_sites": [{"site": "x.py:19"}]}}}}
    assert window_over_budget(whole) is None and window_over_budget({"metrics": {}}) is None
