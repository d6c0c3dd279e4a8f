"""`--help`, every command's `--help` and `ask` must not import torch, psutil or pynvml.

One child runs them all in turn (each is `main()` with its argv) and says, for each heavy module,
the first invocation after which it was imported: a module stays imported, so the union over the
sequence is what one invocation alone would show, and the first one that brings a module in is
the one that imports it (one child, ~1 s, instead of one per command)."""

import json
import subprocess
import sys

from conftest import ROOT

HEAVY = ("torch", "psutil", "pynvml", "numpy")

PROBE = r"""
import json, sys
from torchdoctor.main import main
heavy = {HEAVY}
first = {}
for args in json.loads(sys.argv[1]):
    sys.argv = ["torchdoctor"] + args
    try:
        main()
    except SystemExit:
        pass
    for m in heavy:
        if m in sys.modules and m not in first:
            first[m] = " ".join(args)
sys.stderr.write("HEAVY=" + json.dumps(first) + "\n")
""".replace("{HEAVY}", repr(HEAVY))


def _heavy_imports(invocations):
    """{heavy module: the first invocation after which it was imported}, from one child."""
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(invocations)], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("HEAVY=")]
    assert line, r.stderr[-2000:]
    return json.loads(line[-1][len("HEAVY="):])


def _commands():
    from torchdoctor.cli import app

    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_help_every_commands_help_and_ask_are_light():
    commands = _commands()
    invocations = [["--help"]] + [[c, "--help"] for c in commands]
    if "ask" in commands:
        invocations.append(["ask", "loss is nan"])
    assert len(invocations) > 10  # the commands were found
    assert _heavy_imports(invocations) == {}
