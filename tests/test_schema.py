"""`torchdoctor schema` (issue 32 item 1): generated from the declarations, versioned, and every
report validates (the fixture runs are validated in tests/fixture_runs.py: check_schema)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")

from torchdoctor.catalog import SEVERITIES, catalog  # noqa: E402
from torchdoctor.findings import SCHEMA, STATUSES, Report, finding  # noqa: E402
from torchdoctor.schema import report_schema, validation_errors  # noqa: E402
from torchdoctor.skills import ALL_SKILLS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = sorted(p for p in (ROOT / "tests" / "golden").rglob("*.json") if not p.name.endswith(".expect.json"))


def _report() -> dict:
    rep = Report(command="checkup", target="train.py", metrics={"steps": {"median_step_ms": 1.5}},
                 context={"device": "cpu"})
    rep.add(finding("dataloader-bound", "the loop waits", {"loop": "train.py:3"}, fix="workers"))
    rep.skip("memory-growth", "too few steps")
    return json.loads(json.dumps(rep.to_dict()))


def test_the_schema_is_draft_2020_12_and_versioned_with_the_report():
    s = report_schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert s["$id"].endswith(f"/{SCHEMA}.json") and s["properties"]["schema"] == {"const": SCHEMA,
                                                                                 "description": s["properties"]["schema"]["description"]}


def test_the_schema_is_generated_from_the_declarations_not_written_twice():
    s = report_schema()
    assert list(s["properties"]) == list(Report(command="x").to_dict())  # same keys, same order
    fnd = s["$defs"]["finding"]
    assert fnd["properties"]["code"]["enum"] == sorted(catalog())
    assert fnd["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert fnd["properties"]["skill"]["enum"] == list(ALL_SKILLS)
    assert s["properties"]["status"]["enum"] == list(STATUSES)
    assert list(fnd["properties"]) == list(_report()["findings"][0])


def test_a_report_validates_and_each_break_is_named():
    assert validation_errors(_report()) == []
    for mutate, where in [
        (lambda r: r["findings"][0].update(code="no-such-code"), "findings/0/code"),
        (lambda r: r["findings"][0].update(severity="fatal"), "findings/0/severity"),
        (lambda r: r.update(status="fine"), "status"),
        (lambda r: r.update(schema=SCHEMA + 1), "schema"),
        (lambda r: r.pop("skipped"), "(top)"),
        (lambda r: r["skipped"][0].pop("reason"), "skipped/0"),
        (lambda r: r.update(extra=1), "(top)"),
    ]:
        r = _report()
        mutate(r)
        errors = validation_errors(r)
        assert errors and errors[0].startswith(where), (where, errors)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.relative_to(ROOT / "tests" / "golden").as_posix())
def test_every_golden_report_validates(path: Path):
    """The goldens are normalised fixture reports: numbers inside metrics/evidence are masked,
    the structure the schema constrains (keys, codes, severities, skills, statuses) is kept."""
    data = json.loads(path.read_text())
    rep = data.get("report", data) if isinstance(data, dict) else None
    if not isinstance(rep, dict) or rep.get("tool", "torchdoctor") != "torchdoctor" or "findings" not in rep:
        pytest.skip("not a report golden")
    rep = {"tool": "torchdoctor", "version": "0", "schema": SCHEMA, **rep}  # masked/omitted by normalise
    for key, empty in (("metrics", {}), ("skipped", []), ("artifacts", {}), ("context", {})):
        if isinstance(rep.get(key), str) and rep[key].startswith("<"):  # a whole part masked ("<timeout-run>")
            rep[key] = empty
    assert validation_errors(rep) == []


def test_the_command_prints_the_schema():
    from conftest import run_main

    r = run_main("schema")  # in-process (that it imports no torch is the next test's, in a child)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(json.dumps(report_schema()))


def test_the_schema_command_imports_no_torch():
    probe = ("import contextlib, io, sys\nsys.argv = ['torchdoctor', 'schema']\n"
             "from torchdoctor.main import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        main()\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('torch', 'psutil', 'pynvml', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
