"""Reading a saved report for ``compare``: a torchdoctor JSON report of a known schema, or exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchdoctor.errors import DoctorError

MAX_BYTES = 256 * 2 ** 20  # a report is at most a few MiB; a bigger file is not one


def load_report(path: str) -> dict[str, Any]:
    """The report saved at ``path`` (``--json`` output or ``report.json`` under ``--out``)."""
    from torchdoctor.findings import SCHEMA

    p = Path(path)
    if not p.is_file():
        raise DoctorError(f"{path}: no such file" if not p.exists() else f"{path}: not a regular file",
                          hint="save a report with `torchdoctor checkup --json train.py > before.json`")
    if p.stat().st_size > MAX_BYTES:
        raise DoctorError(f"{path}: {p.stat().st_size} bytes is too large for a torchdoctor report")
    try:
        rep = json.loads(p.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as e:
        raise DoctorError(f"{path}: not a JSON report ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(rep, dict) or rep.get("tool") != "torchdoctor":
        raise DoctorError(f"{path}: not a torchdoctor report (no \"tool\": \"torchdoctor\")")
    if rep.get("command") == "compare":
        raise DoctorError(f"{path}: a comparison, not a report", hint="compare two run reports")
    if rep.get("schema") != SCHEMA:
        raise DoctorError(f"{path}: report schema {rep.get('schema')!r}; this torchdoctor reads schema {SCHEMA}")
    for key, kind in (("metrics", dict), ("findings", list)):
        if not isinstance(rep.get(key), kind):
            raise DoctorError(f"{path}: malformed report ({key!r} is not a {kind.__name__})")
    return rep
