"""What to write where: an adopted trial's fix, from the changes its treated run noted (parent).

Each applier in the child notes the user's ``file:line`` it changed (the line that built the
DataLoader or the optimizer, the line that calls the model or ``zero_grad``) and the code to
write there. A process-wide flag has no line of its own: it goes after the script's
``import torch`` (found by reading the script, never by running or editing it). An
environment variable goes on the command line. torchdoctor never edits the user's files.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any, Sequence

from torchdoctor.runner.frames import short_path


def import_torch_line(script: str | os.PathLike) -> int | None:
    """The line of the script's first ``import torch`` / ``from torch ...`` (top level)."""
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return node.lineno
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            return node.lineno
    return None


def _script_of(run: Any) -> str | None:
    meta = run.evidence.meta or {}
    argv = meta.get("argv") or []
    if meta.get("module") or not argv:
        return None
    p = Path(argv[0])
    if not p.is_absolute():
        p = Path(meta.get("cwd") or ".") / p
    return str(p) if p.is_file() else None


def fix_of(runs: Sequence[Any]) -> tuple[str, list[str], bool]:
    """(fix text, ["file:line", ...], whether anything was changed) of a trial's runs."""
    applied: list[dict[str, Any]] = []
    for r in runs:
        tr = r.evidence.last("treatment") or {}
        if tr.get("applied"):
            applied = tr["applied"]
            break
    if not runs:
        return "", [], False
    lines: list[str] = []
    where: list[str] = []
    changed = False
    for a in applied:
        for c in a.get("changes") or []:
            changed = True
            loc = c.get("where")
            if loc is None and c.get("what") == "flag":
                script = _script_of(runs[0])
                n = import_torch_line(script) if script else None
                loc = f"{script}:{n}" if script and n else None
                at = f"after `import torch` ({short_path(loc)})" if loc else "at the top of the script"
            elif loc is None:
                at = "on the command line"
            else:
                at = f"at {short_path(loc)}"
            if loc and short_path(loc) not in where:
                where.append(short_path(loc))
            lines.append(f"{a.get('name')}: {at}: {c.get('code')}")
    return "\n".join(lines), where, changed
