"""The report model, JSON schema and console rendering (docs/contract.md)."""

import json

from torchdoctor.findings import Report, finding
from torchdoctor.report.console import render_to_text
from torchdoctor.report.jsonout import render_json


def _report():
    r = Report("env", target=None, context={"device": "cpu", "torch": "2.13.0"})
    r.add(finding("tf32-disabled", "TF32 off", {"gpu": "H100"}, fix="torch.backends.cuda.matmul.allow_tf32 = True"))
    r.add(finding("torch-cpu-build-on-gpu-host", "no CUDA in torch", {"gpus": 2}, fix="reinstall"))
    r.skip("gpu-memory-in-use", "no NVIDIA driver")
    return r


def test_json_has_the_contract_keys_and_sorted_findings():
    d = json.loads(render_json(_report()))
    assert d["tool"] == "torchdoctor" and d["schema"] == 1 and d["command"] == "env"
    assert d["status"] == "findings"
    for key in ("version", "target", "findings", "skipped", "metrics", "artifacts"):
        assert key in d
    assert [f["severity"] for f in d["findings"]] == ["error", "info"]
    f = d["findings"][0]
    assert set(f) == {"code", "skill", "severity", "title", "evidence", "fix", "docs"}
    assert f["docs"] == "docs/findings/torch-cpu-build-on-gpu-host.md"
    assert d["skipped"] == [{"rule": "gpu-memory-in-use", "reason": "no NVIDIA driver"}]


def test_nonfinite_evidence_is_valid_json():
    r = Report("nan")
    r.add(finding("tf32-disabled", "x", {"max": float("nan"), "min": float("-inf")}))
    d = json.loads(render_json(r))
    assert d["findings"][0]["evidence"] == {"max": "nan", "min": "-inf"}


def test_exit_codes():
    r = _report()
    assert r.exit_code() == 1
    ok = Report("env")
    assert ok.exit_code() == 0 and ok.status == "ok"
    ok.add(finding("gpu-memory-in-use", "busy", {}))
    assert ok.exit_code() == 0
    assert ok.exit_code("warning") == 1
    failed = Report("profile", run_status="error")
    assert failed.exit_code() == 3


def test_console_rendering_marks_fix_docs_and_footer():
    text = render_to_text(_report())
    assert "torchdoctor env" in text
    assert "✗ torch-cpu-build-on-gpu-host" in text and "• tf32-disabled" in text
    assert "Fix: reinstall" in text
    assert "docs/findings/tf32-disabled.md" in text
    assert "2 findings (1 errors, 0 warnings)" in text
    assert "Not judged: gpu-memory-in-use (no NVIDIA driver)" in text
    assert "No problems found" in render_to_text(Report("env"))
