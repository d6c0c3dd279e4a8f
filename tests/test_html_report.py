"""The HTML report (torchdoctor/report/html): structure per probe, escaping, size, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.report.html import MARKER, render_html
from torchdoctor.report.html.output import HTML_DEFAULT, expand_bare_html, html_target
from torchdoctor.report.html.svg import MAX_POINTS, line_chart

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "<script>alert(1)</script>\x1b[2J<img src=x onerror=alert(2)>&amp;"


def _report(command="checkup", **metrics):
    return {"schema": 1, "tool": "torchdoctor", "version": "0", "command": command,
            "target": "train.py", "status": "findings", "context": {"device": "cpu", "torch": "2.x"},
            "findings": [], "skipped": [], "artifacts": {}, "metrics": metrics}


def _finding(code="memory-growth", severity="warning", title="grows", evidence=None, fix="do x"):
    return {"code": code, "severity": severity, "title": title, "evidence": evidence or {},
            "fix": fix, "docs": f"docs/findings/{code}.md", "skill": "s"}


STEPS = {"median_step_ms": 4.3, "mean_step_ms": 5.0, "p90_step_ms": 9.0, "judged": 49,
         "warmup_skipped": 1, "share": {"data": 0.1, "forward": 0.3, "backward": 0.4,
                                        "optimizer": 0.1, "other": 0.1}}
MEMORY = {"timeline": {"step": list(range(1, 51)), "heap": [100e6 + 8e3 * i for i in range(50)],
                       "rss": [300e6] * 50},
          "trend": {"heap": {"label": "host heap", "bytes_per_step": 8000.0, "r2": 1.0,
                             "growth": {"severity": "warning", "steps_until_full": 10}}},
          "sites": {"graph_growth": [{"site": "train.py:24", "function": "<module>", "nodes_per_step": 11}]},
          "breakdown": {"at": "backward start", "step": 2, "parts": {"parameters": 10, "activations": 30}}}
NAN = {"series_columns": ["step", "optimizer", "loss", "grad_norm"],
       "series": [[i, 0, 2.0 ** i, 1.5 ** i] for i in range(1, 33)],
       "first_nonfinite": {"step": 32, "what": "loss"}}
PROFILE = {"steps": [7, 8, 9], "top_ops_by": "self_cpu",
           "top_ops": [{"name": "aten::mm", "calls": 5.0, "self_cpu_ms": 6.7, "device_ms": 0.0}],
           "python_hotspots": [{"def": "train.py:1", "func": "<module>", "self_ms": 0.04}]}
RANKS = {"per_rank": [{"rank": 0, "steps": 10, "median_step_ms": 44.0, "median_lag_ms": -41.0,
                       "last_share": 0.0},
                      {"rank": 1, "steps": 10, "median_step_ms": 43.0, "median_lag_ms": 41.0,
                       "last_share": 1.0}]}
CHECKPOINT = {"format": "torch-zip", "judged_as": "resume", "files": 1,
              "entries": [{"key": "model", "role": "model", "type": "OrderedDict", "tensors": 9,
                           "bytes": 1440, "dtypes": {"float32": 360}}]}
TRIALS = [{"name": "dataloader-workers", "verdict": "adopt", "speedup": 1.8, "spread": 0.05,
           "baseline_step_ms": 18.0, "treated_step_ms": 10.0, "loss_max_rel_diff": 0.0, "fix": "num_workers=2"},
          {"name": "tf32", "verdict": "skipped", "reason": "no CUDA"}]

SECTION_TITLES = {"steps": "Step time", "memory": "Memory per step", "nan": "Loss and gradient norm",
                  "profile": "Profiler: top ops", "ranks": "Median step time per rank",
                  "checkpoint": "Checkpoint contents", "trials": "Treatments tried"}


@pytest.mark.parametrize("key,value", [("steps", STEPS), ("memory", MEMORY), ("nan", NAN),
                                       ("profile", PROFILE), ("ranks", RANKS),
                                       ("checkpoint", CHECKPOINT), ("trials", TRIALS)])
def test_each_probe_section_is_drawn_from_its_metrics(key, value):
    page = render_html(_report(**{key: value}))
    assert SECTION_TITLES[key] in page
    assert "Other measurements" not in page  # a drawn section is not repeated as raw JSON


def test_page_is_self_contained_and_forbids_requests():
    page = render_html(_report(steps=STEPS, memory=MEMORY, nan=NAN, profile=PROFILE, ranks=RANKS,
                               checkpoint=CHECKPOINT, trials=TRIALS, other={"x": 1}))
    assert page.startswith(MARKER)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
    assert not re.search(r"url\(", page)  # no CSS fetch either
    assert "Other measurements" in page and "&quot;x&quot;: 1" in page


def test_findings_come_first_with_evidence_fix_and_docs():
    rep = _report(steps=STEPS)
    rep["findings"] = [_finding(evidence={"bytes_per_step": 7841, "sites": ["a.py:1", "b.py:2"]})]
    page = render_html(rep)
    assert page.index("Findings") < page.index("Step time")
    assert "memory-growth" in page and "bytes_per_step" in page and "a.py:1\nb.py:2" in page
    assert "<b>Fix:</b> do x" in page and "torchdoctor explain memory-growth" in page


def test_no_findings_says_so():
    assert "No problems found" in render_html(_report())


def test_hostile_strings_render_as_text_never_markup():
    rep = _report(checkpoint={**CHECKPOINT, "entries": [{**CHECKPOINT["entries"][0], "key": HOSTILE}]},
                  ranks=RANKS)
    rep["target"] = HOSTILE
    rep["findings"] = [_finding(title=HOSTILE, evidence={HOSTILE: HOSTILE}, fix=HOSTILE)]
    rep["skipped"] = [{"rule": HOSTILE, "reason": HOSTILE}]
    page = render_html(rep)
    assert "<script>" not in page and "<img" not in page and "\x1b" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    assert "\\x1b[2J" in page  # the control byte is shown, not sent
    assert "&amp;amp;" in page  # an entity in the data is shown as typed


def test_odd_values_are_skipped_and_a_section_that_breaks_does_not_lose_the_report(monkeypatch):
    rep = _report(nan={"series_columns": ["step", "loss"], "series": [[1, {"bad": 1}]]})
    rep["findings"] = [_finding()]
    assert "Loss and gradient norm" not in render_html(rep)  # nothing drawable: no empty section
    import torchdoctor.report.html as html_mod

    def broken(metrics):
        raise KeyError("x")

    monkeypatch.setattr(html_mod, "SECTIONS", [("nan", broken)])
    page = render_html(rep)
    assert "memory-growth" in page and "the nan section could not be drawn: KeyError" in page


def test_a_thousand_step_run_stays_small_and_long_series_are_thinned():
    steps = list(range(1, 1001))
    rep = _report(steps=STEPS, nan={**NAN, "series": [[i, 0, 1.0 + i, 2.0 + i] for i in steps]},
                  memory={**MEMORY, "timeline": {"step": steps, "heap": [1e8 + i for i in steps],
                                                 "rss": [3e8 + i for i in steps]}})
    rep["findings"] = [_finding(evidence={"series": list(range(5000))}) for _ in range(20)]
    assert len(render_html(rep).encode()) < 2 * 2 ** 20
    svg = line_chart([("a", list(range(100_000)), [float(i) for i in range(100_000)])], title="t")
    assert svg.count(",") <= MAX_POINTS + 10


def test_bare_html_is_told_from_a_path_and_the_scripts_own_html_is_left_alone():
    values = {"--steps", "--out", "-m", "--module", "--timeout", "--html"}
    assert expand_bare_html(["--html", "train.py", "--html"], values, False) == \
        [f"--html={HTML_DEFAULT}", "train.py", "--html"]
    assert expand_bare_html(["--steps", "3", "--html=r.html", "train.py"], values, False) == \
        ["--steps", "3", "--html=r.html", "train.py"]
    assert expand_bare_html(["ckpt.pt", "--html"], values, True) == ["ckpt.pt", f"--html={HTML_DEFAULT}"]
    assert expand_bare_html(["--", "--html"], values, True) == ["--", "--html"]


def test_html_target_refuses_a_file_that_is_not_ours(tmp_path: Path):
    from torchdoctor.errors import DoctorError

    script = tmp_path / "train.py"
    script.write_text("print('mine')\n")
    with pytest.raises(DoctorError, match="not a torchdoctor report"):
        html_target(str(script), None)
    assert script.read_text() == "print('mine')\n"
    old = tmp_path / "old.html"
    old.write_text(MARKER + "\n<html></html>")
    assert html_target(str(old), None) == old  # our own earlier report may be replaced
    assert html_target(HTML_DEFAULT, str(tmp_path)) == tmp_path / "torchdoctor-report.html"
    with pytest.raises(DoctorError, match="does not exist"):
        html_target(str(tmp_path / "no" / "r.html"), None)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "torchdoctor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_checkpoint_audit_html_escapes_a_hostile_key(tmp_path: Path):
    torch = pytest.importorskip("torch")
    ck = tmp_path / "ck.pt"
    torch.save({"model": {"w": torch.zeros(2)}, HOSTILE: 1}, ck)
    r = _cli(["checkpoint-audit", str(ck), "--html"], tmp_path)
    assert r.returncode in (0, 1), r.stderr
    page = (tmp_path / "torchdoctor-report.html").read_text()
    assert "Checkpoint contents" in page and "<img" not in page and "<script>" not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page


# A script probe's page under --out (bare --html, beside report.json, the script keeping a later
# --html as its own argument) is checked on the checkup run of
# test_ci_outputs.py::test_checkup_of_a_sick_script_writes_valid_sarif_junit_and_html (one run for both).


def test_the_step_series_is_bounded_and_keeps_the_last_step():
    from torchdoctor.evidence.steps import SERIES_MAX, step_series

    steps = [{"step": i, "wall_s": 0.01, "data_s": 0.002} for i in range(1, 5001)]
    s = step_series(steps)
    assert len(s["step"]) <= SERIES_MAX + 1 and s["step"][0] == 1 and s["step"][-1] == 5000
    assert s["wall_ms"][0] == 10.0 and s["data_ms"][0] == 2.0
    assert step_series(steps[:3]) == {"step": [1, 2, 3], "wall_ms": [10.0] * 3, "data_ms": [2.0] * 3}
    page = render_html(_report(steps={**STEPS, "series": s}))
    assert "Step time and data wait per step" in page
