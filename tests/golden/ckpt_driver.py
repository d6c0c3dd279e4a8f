"""Build every checkpoint fixture (tests/fixtures/checkpoint/builders.py, EXPECTED) into a temp
folder and run `torchdoctor checkpoint-audit --json [ARGS] PATH` on each, all in this one process
(the CLI's own entry, run_app, with stdout captured: one torch import for ~40 audits).

    python tests/golden/ckpt_driver.py OUT.json   -> {name: {"exit": N, "report": {...}, "args": [...]}}
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def load_builders():
    if "ckpt_builders" not in sys.modules:  # the name the test files give it (pickled classes name it)
        spec = importlib.util.spec_from_file_location("ckpt_builders",
                                                      ROOT / "tests" / "fixtures" / "checkpoint" / "builders.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ckpt_builders"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["ckpt_builders"]


def audit_all(paths: dict | None = None) -> dict:
    """{name: {"args", "exit", "report"}} for every builders.EXPECTED entry; `paths`: fixtures
    already built (builders.cached("all") in a test session), else built in a temp folder."""
    from torchdoctor.cli import run_app

    b = load_builders()
    d = tempfile.mkdtemp(prefix="td-ckpt-golden-")
    try:
        paths = paths or b.build_all(d)
        out = {}
        for name in sorted(b.EXPECTED):
            args, _expected = b.EXPECTED[name]
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    code = run_app(["checkpoint-audit", "--json", *args, paths[name.split("@")[0]]])
                except SystemExit as e:  # noqa: PERF203
                    code = e.code
            out[name] = {"args": args, "exit": code, "report": json.loads(buf.getvalue())}
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "120")
    res = audit_all()
    Path(sys.argv[1]).write_text(json.dumps(res))
