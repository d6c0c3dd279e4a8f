"""Team defaults from ``[tool.torchdoctor]`` in the project's pyproject.toml; the CLI overrides them.

    [tool.torchdoctor]
    steps = 30          # --steps N
    timeout = 600       # --timeout SECONDS
    fail-on = "warning" # --fail-on
    out = "td-out"      # --out DIR (relative to the pyproject.toml's folder)

The project is the nearest pyproject.toml in the current folder or above it (the first one found,
whether or not it has the table). The values become the defaults of every command that has the
option (``demo``'s bundled run and ``compare`` excepted), through click's ``default_map``: an option
given on the command line always wins. An unknown key or a value of the wrong type is bad usage
(exit 2, before any work); an unreadable pyproject.toml is a one-line warning and no defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from torchdoctor.errors import DoctorError

KEYS = {"steps": "steps", "timeout": "timeout", "fail-on": "fail_on", "out": "out"}  # toml key → param
EXCLUDED = frozenset({"demo", "compare", "explain", "schema", "ask"})


def find_pyproject(start: Path | None = None) -> Path | None:
    d = (start or Path.cwd()).resolve()
    for folder in (d, *d.parents):
        p = folder / "pyproject.toml"
        if p.is_file():
            return p
    return None


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return {}
    with open(path, "rb") as f:
        return tomllib.load(f)


def _check(key: str, value: Any, path: Path) -> Any:
    where = f"{path} [tool.torchdoctor] {key}"
    if key == "steps":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DoctorError(f"{where} = {value!r}: must be an integer >= 0")
    elif key == "timeout":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise DoctorError(f"{where} = {value!r}: must be a number of seconds > 0")
        value = float(value)
    elif key == "fail-on":
        if value not in ("error", "warning"):
            raise DoctorError(f"{where} = {value!r}: must be \"error\" or \"warning\"")
    elif key == "out":
        if not isinstance(value, str) or not value.strip():
            raise DoctorError(f"{where} = {value!r}: must be a folder path")
        value = str(path.parent / value)
    return value


def project_defaults(start: Path | None = None) -> tuple[Path | None, dict[str, Any]]:
    """(the pyproject.toml, {param name: value}) of ``[tool.torchdoctor]``; DoctorError if unfit."""
    path = find_pyproject(start)
    if path is None:
        return None, {}
    try:
        data = _load_toml(path)
    except (OSError, ValueError) as e:
        from torchdoctor.safe import visible

        print(visible(f"torchdoctor: warning: {path} unreadable, no [tool.torchdoctor] defaults: {e}"),
              file=sys.stderr)
        return path, {}
    table = (data.get("tool") or {}).get("torchdoctor")
    if table is None:
        return path, {}
    if not isinstance(table, dict):
        raise DoctorError(f"{path}: [tool.torchdoctor] must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise DoctorError(f"{path} [tool.torchdoctor]: unknown key(s) {', '.join(unknown)}",
                          hint=f"known: {', '.join(KEYS)}")
    return path, {KEYS[k]: _check(k, v, path) for k, v in table.items()}


def default_map(group: Any, defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """click's ``default_map``: for each command (but EXCLUDED), the defaults it has an option for."""
    out: dict[str, dict[str, Any]] = {}
    for name, cmd in getattr(group, "commands", {}).items():
        if name in EXCLUDED:
            continue
        params = {p.name for p in cmd.params if getattr(p, "param_type_name", "") == "option"}
        mine = {k: v for k, v in defaults.items() if k in params}
        if mine:
            out[name] = mine
    return out
