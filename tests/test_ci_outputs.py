"""CI outputs (issue 32 item 3): --sarif validates against the published SARIF 2.1.0 schema and
names file:line; --junit parses with standard JUnit parsers; both go through report/formats.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from torchdoctor.report.formats import check_target, get
from torchdoctor.report.junit import to_junit
from torchdoctor.report.sarif import location_of, to_sarif

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
SARIF_SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-2.1.0-rtm.5.json").read_text())


def _sarif_errors(doc: dict) -> list[str]:
    v = jsonschema.Draft4Validator(SARIF_SCHEMA)  # the published schema is draft-04
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in v.iter_errors(doc)]


def _report(findings: list[dict], command: str = "checkup", skipped=()) -> dict:
    return {"tool": "torchdoctor", "version": "0.1.0", "schema": 1, "command": command, "target": "train.py",
            "status": "findings" if findings else "ok", "findings": findings, "skipped": list(skipped),
            "metrics": {}, "artifacts": {}, "context": {}}


def _f(code: str, severity: str, title: str, **ev) -> dict:
    return {"code": code, "skill": "performance-profiling", "severity": severity, "title": title,
            "evidence": ev, "fix": "do x", "docs": f"docs/findings/{code}.md"}


def test_sarif_levels_rules_and_locations():
    rep = _report([_f("dataloader-bound", "error", "waits at train.py:37"),
                   _f("unseeded-run", "info", "no seed", where="lib/model.py:12"),
                   _f("internal-error", "warning", "boom \x1b[31m")])
    doc = to_sarif(rep)
    assert _sarif_errors(doc) == []
    run = doc["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["dataloader-bound"]["helpUri"].endswith("docs/findings/dataloader-bound.md")
    assert rules["dataloader-bound"]["defaultConfiguration"]["level"] == "error"
    levels = [r["level"] for r in run["results"]]
    assert levels == ["error", "note", "warning"]
    locs = [r["locations"][0]["physicalLocation"] for r in run["results"]]
    assert (locs[0]["artifactLocation"]["uri"], locs[0]["region"]["startLine"]) == ("train.py", 37)
    assert (locs[1]["artifactLocation"]["uri"], locs[1]["region"]["startLine"]) == ("lib/model.py", 12)
    assert (locs[2]["artifactLocation"]["uri"], locs[2]["region"]["startLine"]) == ("train.py", 1)  # the target
    assert all(run["results"][i]["ruleId"] == run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"]
               for i, r in enumerate(run["results"]))


def test_location_of_prefers_the_title_and_ignores_line_zero():
    assert location_of(_f("x", "error", "at a.py:0", loop="b.py:9")) == ("b.py", 9)
    assert location_of(_f("x", "error", "nothing here")) is None


def test_junit_cases_failures_and_skips():
    rep = _report([_f("dataloader-bound", "error", "waits"), _f("unseeded-run", "info", "no seed")],
                  skipped=[{"rule": "memory-growth", "reason": "too few steps"}])
    root = to_junit(rep)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["dataloader-bound"].find("failure").get("type") == "error"
    assert cases["unseeded-run"].find("failure") is None
    assert len(cases) > 5 and int(root.get("tests")) == len(cases)
    assert int(root.get("failures")) == 1


def test_a_file_not_ours_is_refused_and_ours_is_replaced(tmp_path: Path):
    from torchdoctor.errors import DoctorError

    mine = tmp_path / "results.sarif"
    mine.write_text('{"runs": [{"tool": {"driver": {"name": "other"}}}]}')
    with pytest.raises(DoctorError, match="not written by torchdoctor"):
        check_target("sarif", str(mine))
    mine.write_text(get("sarif").render(_report([])))
    assert check_target("sarif", str(mine)) == mine
    with pytest.raises(DoctorError, match="does not exist"):
        check_target("junit", str(tmp_path / "no" / "j.xml"))


SICK = """\
import sys

import torch
from torch.utils.data import DataLoader, Dataset

print("ARGS", sys.argv[1:])
torch.manual_seed(0)
torch.set_num_threads(1)


class Jittered(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i):
        x = torch.randn(64)
        for _ in range(40):  # the bottleneck: many tiny ops per sample, num_workers=0
            x = x + 0.01 * torch.randn(64)
        return x, x.sum(0, keepdim=True)


model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Jittered(), batch_size=16):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_checkup_of_a_sick_script_writes_valid_sarif_junit_and_html(tmp_path: Path):
    """Acceptance: the SARIF of a sick script (dataloader-bound, as perf/slow_loader.py) validates
    and names file:line; the JUnit file parses with a standard JUnit parser (junitparser) and with
    xml.etree. The same run (one checkup, not two) carries test_html_report's script-probe check:
    a bare --html under --out writes one page there, beside report.json, and the --html after
    SCRIPT is the script's own argument."""
    from torchdoctor.report.html import MARKER

    sarif, junit = tmp_path / "td.sarif", tmp_path / "td.xml"
    script = tmp_path / "train.py"
    script.write_text(SICK)
    before = script.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-m", "torchdoctor", "checkup", "--json", "--steps", "10", "--sarif",
                        str(sarif), "--junit", str(junit), "--out", "o", "--html", "train.py", "--html"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]  # the dataloader-bound error (the html check had a healthy script: 0)
    rep = json.loads(r.stdout)
    assert rep["artifacts"]["sarif"] == str(sarif) and rep["artifacts"]["junit"] == str(junit)
    doc = json.loads(sarif.read_text())
    assert _sarif_errors(doc) == []
    res = [x for x in doc["runs"][0]["results"] if x["ruleId"] == "dataloader-bound"]
    loc = res[0]["locations"][0]["physicalLocation"]
    line = SICK.splitlines().index("for x, y in DataLoader(Jittered(), batch_size=16):") + 1
    assert (loc["artifactLocation"]["uri"], loc["region"]["startLine"]) == ("train.py", line)
    assert res[0]["level"] == "error"
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    # the HTML page (test_html_report's script-probe check)
    assert "ARGS ['--html']" in r.stderr  # the word after SCRIPT is the script's
    page = (tmp_path / "o" / "torchdoctor-report.html").read_text()
    assert page.startswith(MARKER) and "Step time" in page
    assert json.loads((tmp_path / "o" / "report.json").read_text())["artifacts"]["report_html"]
    assert not (tmp_path / "torchdoctor-report.html").exists()  # bare --html under --out: one file
    assert script.read_bytes() == before
    junitparser = pytest.importorskip("junitparser")
    xml = junitparser.JUnitXml.fromfile(str(junit))
    cases = {c.name: c for suite in xml for c in suite}
    assert "dataloader-bound" in cases and not cases["dataloader-bound"].is_passed
    assert any(c.is_passed for c in cases.values())


def test_every_format_renders_the_same_report_dict(tmp_path: Path):
    from torchdoctor.report.formats import MODULES, is_ours, write

    rep = _report([_f("dataloader-bound", "error", "waits at train.py:37")])
    for name in MODULES:
        fmt = get(name)
        path = tmp_path / f"r{fmt.suffix}"
        write(name, path, rep)
        assert is_ours(path, fmt), name
        assert "dataloader-bound" in path.read_text(), name
    assert json.loads((tmp_path / "r.json").read_text()) == rep
