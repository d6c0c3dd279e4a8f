"""One RunOptions from the command line to the child: one name per option, one set of defaults.

The commands build a :class:`RunOptions`; ``run_probe`` (or ``dist``'s pipeline entry) takes it;
``launch`` writes ``wire()`` to ``meta.json`` as the child's ``ctx.options``. These tests stop at
``run_probe`` (no process is started) and read what the child would get.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from torchdoctor.cli import app
from torchdoctor.findings import Report
from torchdoctor.pipeline.options import DEFAULT_STEPS, DEFAULT_TIMEOUT_S, RunOptions


@pytest.fixture
def captured(monkeypatch):
    """The (probe, target, args, options) that ``run_probe`` was called with; an empty report."""
    calls: list[tuple] = []

    def fake_run_probe(probe, target, args, options):
        calls.append((probe, target, list(args), options))
        return Report(command=probe, target=target)

    monkeypatch.setattr("torchdoctor.pipeline.run.run_probe", fake_run_probe)
    return calls


def _script(tmp_path):
    s = tmp_path / "train.py"
    s.write_text("print('hi')\n")
    return str(s)


def _invoke(argv):
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, (res.exit_code, res.output, res.exception)
    return res


def test_script_probe_options_keep_their_names_to_the_child(captured, tmp_path):
    script = _script(tmp_path)
    out = tmp_path / "out"
    _invoke(["profile", "--steps", "7", "--timeout", "9", "--window", "4", "--out", str(out), "--json",
             script, "--steps", "3"])
    probe, target, args, opts = captured[0]
    assert (probe, target, args) == ("profile", script, ["--steps", "3"])  # the script's own --steps
    assert isinstance(opts, RunOptions)
    assert (opts.steps, opts.timeout, opts.module, opts.steps_default) == (7, 9.0, False, 20)
    wire = opts.wire()
    assert wire["steps"] == 7 and wire["timeout"] == 9.0 and wire["steps_default"] == 20
    assert wire["profile_active"] == 4 and wire["trace_max_mb"] == 256.0  # the probe's own, by key
    assert wire["out"] == str(out.resolve())
    assert "module" not in wire and "quiet" not in wire  # the parent's own
    assert "nproc_per_node" not in wire and "node" not in wire  # one process
    json.dumps(wire)  # meta.json


def test_defaults_are_the_pipelines(captured, tmp_path):
    _invoke(["checkup", "--json", _script(tmp_path)])
    opts = captured[0][3]
    assert (opts.steps, opts.timeout, opts.steps_default) == (DEFAULT_STEPS, DEFAULT_TIMEOUT_S, DEFAULT_STEPS)
    assert opts == RunOptions(probe={"rerun": True})  # checkup's --rerun/--no-rerun


def test_gradcheck_resolves_its_target_from_the_probe_options(captured, tmp_path):
    f = tmp_path / "fn.py"
    f.write_text("import torch\nclass Sq(torch.autograd.Function):\n"
                 "    @staticmethod\n    def forward(ctx, x):\n        return x * x\n")
    _invoke(["gradcheck", "--json", "--shape", "2,3", f"{f}:Sq"])
    probe, target, args, opts = captured[0]
    assert probe == "gradcheck" and target == "torchdoctor.gradcheck.single" and opts.module
    assert "shape" not in opts.probe  # taken by the target's resolution, not sent to the child
    assert json.loads(args[2]) == [[2, 3]] and opts.steps_default == 10


def test_nproc_per_node_and_node_reach_the_wire(captured, tmp_path, monkeypatch):
    for k in ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    _invoke(["memory", "--json", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
             "--rdzv-endpoint", "host0:29400", _script(tmp_path)])
    wire = captured[0][3].wire()
    assert wire["nproc_per_node"] == 2
    assert wire["node"]["nnodes"] == 2 and wire["node"]["node_rank"] == 1
    assert wire["node"]["rdzv_endpoint"] == "host0:29400"
    assert captured[0][3].node_spec().port == 29400
    json.dumps(wire)


def test_dist_script_builds_the_same_options(captured, tmp_path):
    _invoke(["dist", "--json", "--nproc-per-node", "3", "--steps", "5", _script(tmp_path)])
    probe, _, _, opts = captured[0]
    assert probe == "dist" and opts.nproc_per_node == 3 and opts.steps == 5
    assert opts.timeout == DEFAULT_TIMEOUT_S and opts.steps_default == DEFAULT_STEPS


def test_a_mapping_is_read_by_the_same_names():
    # the benches' and older callers' dicts: fields by name, any other key a probe option
    opts = RunOptions.of({"steps": 0, "timeout": 900, "quiet": True, "module": True, "nan_capture": {"step": 3}})
    assert (opts.steps, opts.timeout, opts.quiet, opts.module) == (0, 900, True, True)
    assert dict(opts.probe) == {"nan_capture": {"step": 3}}
    assert RunOptions.of(opts) is opts and RunOptions.of(None) == RunOptions()


def test_a_followups_extras_override_fields_and_add_probe_options():
    base = RunOptions(steps=50, probe={"check_every": 2})
    again = base.with_options({"nan_capture": {"step": 7}, "steps": 7, "followup": 1, "guard_files": True})
    assert again.steps == 7 and base.steps == 50  # frozen: the first run's options are unchanged
    wire = again.wire()
    assert wire["steps"] == 7 and wire["check_every"] == 2 and wire["nan_capture"] == {"step": 7}
    assert wire["followup"] == 1 and wire["guard_files"] is True
    with pytest.raises(Exception):
        base.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        base.probe["x"] = 1  # type: ignore[index]


def test_label_and_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RunOptions(module=True).label("pkg.train") == "-m pkg.train"
    assert RunOptions().label("train.py") == "train.py"
    assert RunOptions(out="o").resolved().out == str(tmp_path / "o")
    assert RunOptions().resolved().out is None


def test_the_run_defaults_are_assigned_in_one_module():
    # DEFAULT_STEPS = 50 and DEFAULT_TIMEOUT_S lived in commands/_script.py, pipeline/run.py,
    # pipeline/judging.py and commands/dist.py (SCRIPT_STEPS, SCRIPT_TIMEOUT_S); a command's own
    # --steps default (profile 20, compile 30, ...) is its steps_default, not a second run default
    import ast
    from pathlib import Path

    import torchdoctor

    pkg = Path(torchdoctor.__file__).parent
    found = []
    for p in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for t in node.targets:
                    name = getattr(t, "id", "")
                    if name in ("DEFAULT_TIMEOUT_S", "SCRIPT_TIMEOUT_S", "SCRIPT_STEPS") or (
                            name == "DEFAULT_STEPS" and node.value.value == DEFAULT_STEPS):
                        found.append(f"{p.relative_to(pkg).as_posix()} {name}")
    assert found == ["pipeline/options.py DEFAULT_STEPS", "pipeline/options.py DEFAULT_TIMEOUT_S"], found
