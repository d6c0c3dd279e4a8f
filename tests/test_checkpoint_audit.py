"""checkpoint-audit: exact findings on a fixture set that covers every checkpoint code."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.catalog import catalog
from torchdoctor.report.console import render_to_text

from conftest import run_main  # the CLI in this process: exit codes and messages of an audit that reads, never runs

HERE = Path(__file__).resolve().parent


def _load_builders():
    if "ckpt_builders" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ckpt_builders",
                                                      HERE / "fixtures" / "checkpoint" / "builders.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ckpt_builders"] = mod  # torch.save of a whole Net pickles it by module name
        spec.loader.exec_module(mod)
    return sys.modules["ckpt_builders"]


builders = _load_builders()


@pytest.fixture(scope="session")
def fx():
    return builders.cached("all")


def _audit(path, **kw):
    return run(path, Options(**kw))


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


@pytest.mark.parametrize("name", sorted(builders.EXPECTED))
def test_fixture_raises_exactly_the_expected_findings(fx, name):
    args, expected = builders.EXPECTED[name]
    expect = args[1] if args[:1] == ["--expect"] else "auto"
    rep = _audit(fx[name.split("@")[0]], expect=expect)
    assert _codes(rep) == expected, [(f.code, f.title) for f in rep.findings]
    assert len(rep.findings) == len(expected)  # one finding per code, no duplicates


def test_fixtures_cover_every_checkpoint_code():
    covered = {c for _a, exp in builders.EXPECTED.values() for c in exp}
    # bad inputs / --model / one file of a multi-file layout: their own test files
    covered |= {"ckpt-unreadable", "ckpt-model-mismatch", "ckpt-part-file"}
    assert covered == {c for c in catalog() if c.startswith("ckpt-")}


def test_complete_checkpoints_raise_no_warning(fx):
    # complete_numpy_rng is left out on purpose: a plain torch.load refuses its numpy RNG state (a warning)
    for name in ("complete", "complete_legacy", "dcp", "hf_trainer"):
        rep = _audit(fx[name])
        assert all(f.severity == "info" for f in rep.findings), (name, [f.title for f in rep.findings])
        assert rep.exit_code("warning") == 0


def test_roles_and_contents_in_metrics(fx):
    m = _audit(fx["complete"]).metrics["checkpoint"]
    assert m["format"] == "torch-zip" and m["judged_as"] == "resume"
    roles = {e["key"]: e["role"] for e in m["entries"]}
    assert roles["model"] == "model" and roles["optimizer"] == "optimizer" and roles["scheduler"] == "scheduler"
    assert roles["scaler"] == "scaler" and roles["epoch"] == "progress" and roles["config"] == "config"
    assert set(m["roles"]["rng"]) == {"torch", "python"}
    assert m["roles"]["model"]["tensors"] == 9
    assert m["weights_only_load"] == "loads"
    assert m["scan"]["tensors"] > 0 and m["scan"]["nonfinite_tensors"] == 0


def test_hf_trainer_folder_is_read_as_one_checkpoint(fx):
    rep = _audit(fx["hf_trainer"])
    r = rep.metrics["checkpoint"]["roles"]
    assert r["model"]["path"] == "model.safetensors"
    assert r["optimizer"][0]["path"] == "optimizer.pt" and r["scheduler"] == ["scheduler.pt"]
    assert set(r["rng"]) == {"python", "numpy", "torch"}
    assert "trainer_state.json.global_step" in r["progress"]


def test_dcp_folder_roles(fx):
    r = _audit(fx["dcp"]).metrics["checkpoint"]["roles"]
    assert r["model"]["path"] == "model" and r["model"]["tensors"] == 9
    assert r["optimizer"][0]["params"] == 6 and r["scheduler"] == ["sched"] and r["rng"] == {"torch": "rng.torch"}


def test_nonfinite_names_tensors_and_counts(fx):
    f = next(f for f in _audit(fx["nonfinite"]).findings if f.code == "ckpt-nonfinite-weights")
    text = " ".join(f.evidence["tensors"])
    assert "model.fc1.weight" in text and "1 NaN" in text and "model.fc2.bias" in text and "1 +Inf" in text
    f16 = next(f for f in _audit(fx["nonfinite_fp16_safetensors"]).findings if f.code == "ckpt-nonfinite-weights")
    assert f16.evidence["tensors"] == ["fc2.weight float16[2, 8]: 1 -Inf"]
    bf = next(f for f in _audit(fx["nonfinite_bf16"]).findings if f.code == "ckpt-nonfinite-weights")
    assert bf.evidence["tensors"] == ["fc1.bias bfloat16[8]: 1 NaN"]


def test_weights_export_modes(fx):
    assert _codes(_audit(fx["weights_safetensors"], expect="weights")) == {}
    rep = _audit(fx["weights_state_dict"])
    assert {s.rule for s in rep.skipped} >= {"ckpt-missing-rng", "ckpt-missing-progress"}


def test_audit_never_imports_torch(fx):
    code = ("import sys; from torchdoctor.pipeline.checkpoint import run, Options; "
            f"run({fx['complete']!r}, Options()); run({fx['dcp']!r}, Options()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_cli_json_and_exit_codes(fx):
    ok = run_main("checkpoint-audit", fx["complete"], "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert d["command"] == "checkpoint-audit" and d["status"] == "ok" and d["findings"] == []
    bad = run_main("checkpoint-audit", fx["nonfinite"], "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["findings"][0]["code"] == "ckpt-nonfinite-weights"
    warn = run_main("checkpoint-audit", fx["missing_rng"], "--expect", "resume", "--fail-on", "warning")
    assert warn.returncode == 1 and "ckpt-missing-rng" in warn.stdout
    usage = run_main("checkpoint-audit", fx["complete"], "--expect", "sometimes")
    assert usage.returncode == 2 and "--expect" in usage.stderr and "Traceback" not in usage.stderr


def test_console_shows_contents_table(fx):
    text = render_to_text(_audit(fx["complete"]), width=140)
    assert "Checkpoint torch-zip" in text and "judged as resume checkpoint" in text
    for word in ("entry", "role", "optimizer", "scheduler", "progress", "torch.load(weights_only=True): loads"):
        assert word in text
    assert "No problems found" in text
