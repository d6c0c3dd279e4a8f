"""The Python API (issue 32 item 4): a probe from Python, in a child process, returns the report
object with the JSON's fields and renders as HTML in Jupyter; `import torchdoctor` stays light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """import os, torch
open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), 0.1)
for _ in range(100):
    o.zero_grad(); m(torch.ones(2, 4)).sum().backward(); o.step()
"""

PROBE = r"""
import json, os, sys
import torchdoctor
light = sorted(m for m in ("torch", "numpy", "psutil", "typer", "rich") if m in sys.modules)
rep = torchdoctor.checkup(sys.argv[1], args=["x"], steps=5, timeout=120)
print(json.dumps({"light": light, "after": "torch" in sys.modules, "pid": os.getpid(),
                  "status": rep.status, "command": rep.command, "keys": list(rep.to_dict()),
                  "steps": rep.metrics["run"].get("steps"), "exit": rep.exit_code,
                  "html": rep._repr_html_()[:200], "codes": rep.codes}))
"""


def test_checkup_from_python_runs_in_a_child_and_returns_the_report(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PID_FILE": str(tmp_path / "pid"), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", PROBE, str(script)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["light"] == [] and got["after"] is False  # nothing heavy in the caller, before or after
    assert int((tmp_path / "pid").read_text()) != got["pid"]  # the script ran in another process
    assert got["command"] == "checkup" and got["status"] in ("ok", "findings") and got["exit"] == 0
    assert got["steps"] == 5
    from torchdoctor.schema import report_schema

    assert got["keys"] == list(report_schema()["properties"])
    assert got["html"].startswith("<!-- torchdoctor report -->")


def test_report_object_round_trips_the_json_and_validates():
    pytest.importorskip("jsonschema")
    from torchdoctor.api import RunReport
    from torchdoctor.findings import Report, finding
    from torchdoctor.schema import validation_errors

    rep = Report(command="checkup", target="t.py")
    rep.add(finding("dataloader-bound", "waits", {"loop": "t.py:3"}, fix="workers"))
    data = json.loads(json.dumps(rep.to_dict()))
    obj = RunReport.from_dict(data, exit_code=1)
    assert obj.to_dict() == data and obj.codes == ["dataloader-bound"] and obj.findings[0].evidence["loop"] == "t.py:3"
    assert validation_errors(obj.to_dict()) == []
    assert "dataloader-bound" in obj._repr_html_()


def test_bad_usage_raises_with_the_cli_message(tmp_path: Path):
    from torchdoctor.api import TorchdoctorError, checkup

    with pytest.raises(TorchdoctorError, match="not found|No such|does not exist") as e:
        checkup(tmp_path / "missing.py", steps=1, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert e.value.exit_code == 2


def test_the_package_names_resolve_lazily():
    r = subprocess.run([sys.executable, "-c", "import sys, torchdoctor; f = torchdoctor.checkup; "
                        "import torchdoctor.api as a; assert f is a.checkup and torchdoctor.demo is a.demo; "
                        "print(sorted(m for m in ('torch', 'typer', 'rich') if m in sys.modules))"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
