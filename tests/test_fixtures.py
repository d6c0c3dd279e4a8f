"""End to end on every headed fixture script, collected by glob (tests/fixture_runs.py).

Each fixture under tests/fixtures/scripts/ with a `# torchdoctor: COMMAND` header is run once
(the session cache: other tests that need the same run reuse it) with --json, and
- the exact set of `code@severity` it raises equals its `# expect:` header (host-load
  cpu-oversubscribed aside);
- its normalised report and exit code equal its golden file tests/golden/scripts/<path>.json
  (regenerate with `.venv/bin/python tests/golden/regen.py PATH`, review the diff).
GPU-only fixtures (`# requires: cuda` / `2 gpus`) are skipped without CUDA and have no golden
(they are checked on their code set only). The checkpoint fixtures' goldens are compared by one
test that audits them all in one process (tests/golden/ckpt_driver.py).

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

from fixture_runs import GOLDEN, dumps, headed_fixtures, normalise, run_fixture

HERE = Path(__file__).resolve().parent
HEADS = headed_fixtures()


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


@pytest.mark.parametrize("h", PARAMS)
def test_fixture_raises_its_header_and_matches_its_golden(h):
    run = run_fixture(h.rel)
    assert run.codes == h.expect, (
        f"{h.rel}: raised {sorted(run.codes)}, header says {sorted(h.expect)}; "
        + json.dumps([(f["code"], f["severity"], f["title"]) for f in run.report["findings"]])[:3000])
    if h.requires:
        return  # GPU fixtures: no golden (made on the GPU box, not here)
    assert h.golden.exists(), f"no golden for {h.rel}: run .venv/bin/python tests/golden/regen.py {h.rel}"
    golden = json.loads(h.golden.read_text())
    got = {"exit": run.returncode, "codes": sorted(run.codes), "report": normalise(run.report)}
    if got != golden:  # show a readable diff of the normalised reports
        import difflib

        diff = "".join(difflib.unified_diff(dumps(golden).splitlines(True), dumps(got).splitlines(True),
                                            "golden", "this run", n=2))
        pytest.fail(f"{h.rel} differs from {h.golden.relative_to(HERE.parent)}:\n{diff[:6000]}")


def test_every_runnable_fixture_script_has_a_header():
    scripts = HERE / "fixtures" / "scripts"
    helpers = {"dist/_common.py", "dist/_lm.py", "perf/_gpu_net.py", "run/siblib.py"}
    headed = {h.rel for h in HEADS}
    for p in sorted(scripts.rglob("*.py")):
        rel = p.relative_to(scripts).as_posix()
        if rel in helpers or p.name == "__init__.py" or rel in {"run/modpkg/model.py", "proc/modproj/pkg/helper.py"}:
            continue
        assert rel in headed, f"{rel}: no `# torchdoctor:` header (or add it to the helpers here)"


def test_every_cpu_golden_belongs_to_a_headed_fixture():
    cpu = {h.golden for h in HEADS if not h.requires and not h.skip}
    files = set((GOLDEN / "scripts").rglob("*.json"))
    assert files == cpu, (sorted(map(str, files - cpu)), sorted(map(str, cpu - files)))


def ckpt_goldens() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((GOLDEN / "checkpoint").glob("*.json"))}


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


def test_checkpoint_fixtures_match_their_goldens():
    pytest.importorskip("torch")
    sys.path.insert(0, str(GOLDEN))
    import ckpt_driver

    b = ckpt_driver.load_builders()  # the same module the checkpoint tests load (one build per session)
    raw = ckpt_driver.audit_all(b.cached("all"))
    golden = ckpt_goldens()
    assert set(raw) == set(golden)
    for name, r in raw.items():
        got = {"args": r["args"], "exit": r["exit"],
               "codes": sorted(f"{f['code']}@{f['severity']}" for f in r["report"]["findings"]),
               "report": normalise(r["report"])}
        assert got == golden[name], (f"checkpoint/{name} differs from its golden (tests/golden/regen.py "
                                     f"--ckpt): {first_difference(got, golden[name])}")
