"""Why a checkpoint (or one of its files) could not be read."""

from __future__ import annotations


class Unreadable(Exception):
    """The bytes are there but are not a checkpoint torchdoctor can read.

    ``what`` names the kind of problem in a few words (``truncated zip``, ``empty file``,
    ``random bytes`` …) and ``detail`` says what was seen; ``path`` is the file concerned.
    """

    def __init__(self, what: str, detail: str, path: str = "", pickles: list | None = None):
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail
        self.path = path
        self.pickles = list(pickles or [])  # opcode scans made before the failure (still judged for safety)


def strip_ansi(text: str) -> str:
    """torch error texts carry ANSI bold codes: remove them before rendering."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)
