"""Where the per-code doc pages live, and the headings each must have (DESIGN.md)."""

from __future__ import annotations

import sys
from pathlib import Path

REQUIRED_HEADINGS = ("What it means", "Why it matters", "How it is measured", "How to fix", "References")


def findings_dirs() -> list[Path]:
    """Candidate folders of docs/findings: the source tree, then an installed share/ copy."""
    here = Path(__file__).resolve().parent
    return [here.parent / "docs" / "findings", Path(sys.prefix) / "share" / "torchdoctor" / "docs" / "findings"]


def doc_path(code: str) -> Path | None:
    for d in findings_dirs():
        p = d / f"{code}.md"
        if p.is_file():
            return p
    return None
