"""Packaging (issue 32 item 6): the wheel ships every file the commands need; team defaults from
[tool.torchdoctor] with the CLI overriding; shell completion on."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ("import torch\nm = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(8):\n    o.zero_grad(); m(torch.ones(1, 2)).sum().backward(); o.step()\n")


def _td(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "torchdoctor", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_project_defaults_apply_and_the_cli_overrides(tmp_path: Path, monkeypatch):
    """A real run under the project's defaults; then, in-process with a stand-in run, the CLI's
    own --steps and --out override them (what the command decides before its run)."""
    from conftest import run_main
    from torchdoctor.findings import Report

    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nsteps = 3\ntimeout = 77\nfail-on = "warning"\n'
                                             'out = "td-out"\n')
    sub = tmp_path / "src"
    sub.mkdir()
    (sub / "t.py").write_text(TINY)
    r = _td("checkup", "--json", "t.py", cwd=sub)  # the nearest pyproject.toml above the cwd
    assert r.returncode in (0, 1), r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["metrics"]["run"]["steps"] == 3 and "timeout 77 s" in r.stderr
    assert "[tool.torchdoctor]" in r.stderr and (tmp_path / "td-out" / "report.json").is_file()
    given = []

    def stand_in(probe, target, args, options=None):
        given.append(options)
        return Report(probe, target=target)

    monkeypatch.setattr("torchdoctor.pipeline.run.run_probe", stand_in)
    r = run_main("checkup", "--json", "--steps", "5", "--out", str(tmp_path / "o2"), "t.py", cwd=sub)
    assert r.returncode == 0 and len(given) == 1, r.stderr[-2000:]
    assert given[0].steps == 5 and Path(given[0].out) == tmp_path / "o2", given[0]
    assert given[0].timeout == 77  # the project's, where the CLI gives none
    assert (tmp_path / "o2" / "report.json").is_file()


@pytest.mark.parametrize("table, message", [
    ('[tool.torchdoctor]\nstep = 3\n', "unknown key"),
    ('[tool.torchdoctor]\nsteps = -1\n', "integer >= 0"),
    ('[tool.torchdoctor]\nfail-on = "never"\n', "error"),
    ('[tool.torchdoctor]\ntimeout = "long"\n', "seconds > 0"),
])
def test_bad_project_defaults_are_exit_2_before_any_work(tmp_path: Path, table: str, message: str, cli_inproc):
    (tmp_path / "pyproject.toml").write_text(table)
    (tmp_path / "t.py").write_text("raise SystemExit('must not run')\n")
    r = cli_inproc("checkup", "t.py", cwd=tmp_path)  # in-process, any run forbidden
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert "must not run" not in r.stderr


def test_help_and_demo_are_not_bound_by_project_defaults(tmp_path: Path):
    from torchdoctor.config import EXCLUDED, default_map, project_defaults

    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nsteps = 3\nfail-on = "warning"\n')
    path, defaults = project_defaults(tmp_path)
    assert path == tmp_path / "pyproject.toml" and defaults == {"steps": 3, "fail_on": "warning"}
    import typer.main

    from torchdoctor.cli import app

    dm = default_map(typer.main.get_command(app), defaults)
    assert dm["checkup"] == {"steps": 3, "fail_on": "warning"} and dm["env"] == {"fail_on": "warning"}
    assert not set(dm) & EXCLUDED


def test_shell_completion_is_on(tmp_path: Path):
    """Through the console entry point in this process (``torchdoctor.main.main``, as the
    installed script calls it): two CLI children ran past the fast lane's 1 s on a loaded box."""
    from conftest import run_main

    r = run_main(env={"_TORCHDOCTOR_COMPLETE": "complete_bash", "COMP_WORDS": "torchdoctor checkup --st",
                      "COMP_CWORD": "2"}, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["--steps"], r.stderr
    assert "--install-completion" in run_main("--help", cwd=tmp_path).stdout


def _site_packages() -> list[str]:
    return [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path):
    """Build the wheel from a copy of the tree (the checkout is left as it is), install it into a
    fresh venv that sees this environment's torch & deps through a .pth (the venv's own
    site-packages first), then run demo, explain and schema from a folder outside the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "torchdoctor", src / "torchdoctor", ignore=ignore)
    shutil.copytree(ROOT / "docs", src / "docs", ignore=ignore)
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next(dist.glob("torchdoctor-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_outer_deps.pth").write_text("\n".join(_site_packages()) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    td = str(venv / "bin" / "torchdoctor")

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([td, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([str(py), "-c", "import torchdoctor; print(torchdoctor.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert where.startswith(purelib), where  # the wheel's copy, not the checkout
    r = run("explain", "dataloader-bound")
    assert r.returncode == 0 and "What it means" in r.stdout, r.stderr[-2000:]
    r = run("schema")
    assert r.returncode == 0 and json.loads(r.stdout)["$schema"].endswith("2020-12/schema"), r.stderr[-2000:]
    r = run("demo", "--json", "--steps", "12", timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "dataloader-bound" in {f["code"] for f in json.loads(r.stdout)["findings"]}
