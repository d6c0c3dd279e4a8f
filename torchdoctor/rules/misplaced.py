"""torchdoctor options written after SCRIPT: they went to the script, whose parser refused them.

``torchdoctor checkup main.py --epochs 1 --json`` gives ``--json`` to *main.py* (everything
after SCRIPT is the script's own, untouched); its argparse exits 2 with "unrecognized
arguments: --json". :func:`misplaced_options` finds that case from the run's evidence so the
crash finding can say where the option belongs, instead of only "the script exited 2".
"""

from __future__ import annotations

import functools
import re
from typing import Any

# the options of torchdoctor's script probes when the CLI cannot be read (see torchdoctor_options)
FALLBACK_OPTIONS = frozenset({
    "--steps", "--timeout", "--json", "--out", "--fail-on", "--nproc-per-node", "-m", "--module",
})


@functools.lru_cache(maxsize=1)
def torchdoctor_options() -> frozenset:
    """Every option of torchdoctor's commands, read from the CLI itself (so a new option is
    known without a list to keep in step)."""
    try:
        import typer.main

        from torchdoctor.cli import app

        out = set(FALLBACK_OPTIONS)
        for cmd in typer.main.get_command(app).commands.values():
            for p in cmd.params:
                if getattr(p, "param_type_name", "") == "option":
                    out.update(o for o in p.opts + p.secondary_opts if o.startswith("-"))
        return frozenset(out - {"-h", "--help"})
    except Exception:  # noqa: BLE001 - reading the CLI is a convenience, never a failure
        return FALLBACK_OPTIONS


# argparse ("unrecognized arguments: --json --out x"), click/typer ("No such option: --json")
_REFUSED = re.compile(r"unrecognized arguments?:\s*(.+)$|No such option:\s*(\S+)|"
                      r"unknown (?:option|argument)s?:?\s*(\S+)", re.I)


def misplaced_options(result: dict[str, Any], script_args: list[str]) -> list[str]:
    """torchdoctor options that the script's parser refused (exit code 2), in order."""
    if result.get("outcome") != "exit" or result.get("exit_code") != 2:
        return []
    refused: list[str] = []
    for line in result.get("output_tail") or []:
        m = _REFUSED.search(line)
        if m:
            refused += (m.group(1) or m.group(2) or m.group(3) or "").split()
    passed = {a.split("=", 1)[0] for a in script_args}
    out = []
    for tok in refused:
        flag = tok.split("=", 1)[0].strip("'\"")
        if flag in torchdoctor_options() and flag in passed and flag not in out:
            out.append(flag)
    return out
