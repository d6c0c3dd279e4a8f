"""checkpoint-audit --model MODULE:FACTORY: keys, prefixes, shapes, optimizer vs parameters."""

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.errors import DoctorError

from conftest import run_main  # the CLI in this process: exit codes and messages of an audit that reads, never runs

HERE = Path(__file__).resolve().parent


def _builders():
    if "ckpt_builders" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ckpt_builders", HERE / "fixtures" / "checkpoint" / "builders.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ckpt_builders"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["ckpt_builders"]


MODEL_SRC = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self, width=8):
            super().__init__()
            self.fc1 = nn.Linear(4, width)
            self.bn = nn.BatchNorm1d(width)
            self.fc2 = nn.Linear(width, 2)

    def build():
        return Net()

    def build_wide():
        return Net(16)

    def broken():
        raise RuntimeError("no config file")

    INSTANCE = Net()
''')


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "mymodel.py").write_text(MODEL_SRC)
    return _builders().cached("all"), str(d / "mymodel.py")


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


def test_matching_model_raises_nothing(env):
    fx, mod = env
    rep = run(fx["complete"], Options(model=f"{mod}:build"))
    assert _codes(rep) == {}
    facts = rep.metrics["checkpoint"]["facts"]
    assert facts["model_compare"]["matched"] == 9 and facts["model_compare"]["missing"] == 0
    assert facts["optimizer_vs_params"][0]["against"] == "--model"
    assert not any(s.rule == "ckpt-model-mismatch" for s in rep.skipped)


def test_instance_attribute_works_too(env):
    fx, mod = env
    assert _codes(run(fx["complete"], Options(model=f"{mod}:INSTANCE"))) == {}


def test_ddp_prefix_proven_by_model_is_a_warning(env):
    fx, mod = env
    rep = run(fx["ddp_prefix"], Options(model=f"{mod}:build"))
    assert _codes(rep) == {"ckpt-wrapper-prefix": "warning"}
    assert "checked against --model" in rep.findings[0].title


def test_wrong_architecture_is_a_model_and_optimizer_mismatch(env):
    fx, mod = env
    rep = run(fx["complete"], Options(model=f"{mod}:build_wide"))
    assert _codes(rep) == {"ckpt-model-mismatch": "error", "ckpt-optimizer-mismatch": "error"}
    mm = next(f for f in rep.findings if f.code == "ckpt-model-mismatch")
    assert "fc1.weight: checkpoint [8, 4] vs model [16, 4]" in mm.evidence["shape_mismatches"]
    om = next(f for f in rep.findings if f.code == "ckpt-optimizer-mismatch")
    assert "parameter #0 (fc1.weight)" in om.title


def test_missing_and_unexpected_keys_with_prefix_suggestion(env, tmp_path):
    fx, mod = env
    sd = _builders().build_model().state_dict()
    lightning = {f"model.{k}": v for k, v in sd.items() if k != "fc2.bias"}
    lightning["model.extra.weight"] = torch.ones(1)
    torch.save({"state_dict": lightning}, tmp_path / "l.ckpt")
    rep = run(str(tmp_path / "l.ckpt"), Options(model=f"{mod}:build"))
    f = next(f for f in rep.findings if f.code == "ckpt-model-mismatch")
    assert f.evidence["missing_keys"] == ["fc2.bias"] and f.evidence["unexpected_keys"] == ["model.extra.weight"]
    assert f.evidence["keys_fit_better_after"].startswith("strip 'model.'")


@pytest.mark.parametrize("spec,msg", [
    ("no_such_module_xyz:build", "cannot import"),
    ("{mod}:nothing", "has no attribute"),
    ("{mod}:broken", "raised RuntimeError: no config file"),
    ("justaname", "MODULE:FACTORY"),
])
def test_bad_model_spec_is_a_usage_error(env, spec, msg):
    fx, mod = env
    with pytest.raises(DoctorError, match=msg):
        run(fx["complete"], Options(model=spec.format(mod=mod)))


def test_cli_model_mismatch_exit_1_and_bad_spec_exit_2(env):
    fx, mod = env
    r = run_main("checkpoint-audit", fx["complete"], "--model", f"{mod}:build_wide", "--json")
    assert r.returncode == 1
    assert "ckpt-model-mismatch" in {f["code"] for f in json.loads(r.stdout)["findings"]}
    from typer.testing import CliRunner

    from torchdoctor.cli import app

    res = CliRunner().invoke(app, ["checkpoint-audit", fx["complete"], "--model", f"{mod}:broken"])
    assert res.exit_code == 2 and "no config file" in res.output and "Traceback" not in res.output
