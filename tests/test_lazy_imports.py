"""`--help`, every command's `--help` and `ask` must not import torch, psutil or pynvml."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

HEAVY = ("torch", "psutil", "pynvml", "numpy")

PROBE = r"""
import json, sys
sys.argv = ["torchdoctor"] + json.loads(sys.argv[1])
from torchdoctor.main import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in {HEAVY} if m in sys.modules)
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\n")
""".replace("{HEAVY}", repr(HEAVY))


def _heavy_imports(args):
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("HEAVY=")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][len("HEAVY="):])


def _commands():
    from torchdoctor.cli import app

    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_top_level_help_is_light():
    assert _heavy_imports(["--help"]) == []


@pytest.mark.parametrize("command", _commands())
def test_command_help_is_light(command):
    assert _heavy_imports([command, "--help"]) == []


def test_ask_is_light():
    if "ask" not in _commands():
        pytest.skip("ask not built")
    assert _heavy_imports(["ask", "loss is nan"]) == []
