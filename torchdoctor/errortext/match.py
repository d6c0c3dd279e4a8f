"""The matcher over the error-text table: which rows a text matches (``extract`` reads their numbers).

A row matches a text when its ``key`` (a lower-case literal) is in the lower-cased text and its
pattern (case-insensitive) is found in it. ``ask`` scans a whole log line by line with
:func:`per_line` (``triage/logscan.py``); the rules ask about one exception message or one output
line with :func:`search`. Selections (``rows(code=..., group=...)``) keep the table's order: where order
decides (the crash routes), the first matching row wins.
"""

from __future__ import annotations

import functools
import re
from typing import Protocol

from torchdoctor.errortext.numbers import extract  # noqa: F401 - the API's number extractors
from torchdoctor.errortext.table import TABLE, Known


@functools.lru_cache(maxsize=None)
def rows(*, code: str | None = None, group: str | None = None) -> tuple[Known, ...]:
    """The rows with that finding ``code`` and/or in that ``group``, in table order."""
    return tuple(k for k in TABLE if (code is None or k.code == code)
                 and (group is None or group in k.groups))


def groups(*names: str) -> tuple[Known, ...]:
    """The rows of any of the ``names`` groups, in table order."""
    return tuple(k for k in TABLE if any(n in k.groups for n in names))


def search(text: str, among: tuple[Known, ...], lower: str | None = None
           ) -> tuple[Known, re.Match] | None:
    """The first row of ``among`` (in its order) whose pattern is found in ``text``, with its match."""
    low = text.lower() if lower is None else lower
    for k in among:
        if k.key in low:
            m = k.regex().search(text)
            if m:
                return k, m
    return None


def matches(text: str, among: tuple[Known, ...]) -> bool:
    return search(text, among) is not None


class Lines(Protocol):
    """A text split into lines once (``triage/logscan.py``'s ``_Text``)."""

    lower: str
    starts: list[int]

    def line_of(self, pos: int) -> int: ...
    def match_window(self, i: int, pos: int) -> tuple[str, int]: ...


def per_line(t: Lines, among: tuple[Known, ...]) -> dict[int, tuple[int, Known, re.Match]]:
    """Per line index of a log: (order in ``among``, row, match) of the first row matching there.

    Each row's key is found with ``str.find`` over the whole lower-cased text; its regex runs only
    on the lines holding the key, on what ``t.match_window`` shows of them (the line, capped around
    the key, plus the lines it may wrap onto), and counts when the match starts on that line."""
    best: dict[int, tuple[int, Known, re.Match]] = {}
    for order, k in enumerate(among):
        if k.key not in t.lower:
            continue
        rx = k.regex()
        pos = t.lower.find(k.key)
        seen_line = -1
        while pos != -1:
            i = t.line_of(pos)
            if i != seen_line:
                seen_line = i
                if i not in best or best[i][0] > order:
                    win, first_len = t.match_window(i, pos)
                    m = rx.search(win)
                    if m and m.start() <= first_len:
                        best[i] = (order, k, m)
            nxt = t.starts[i + 1] if i + 1 < len(t.starts) else len(t.lower)
            pos = t.lower.find(k.key, max(pos + 1, nxt))
    return best


def code_of(text: str, codes: tuple[str, ...]) -> str | None:
    """The first of ``codes`` (in that order of precedence) that a row of the table finds in ``text``."""
    low = text.lower()
    for c in codes:
        if search(text, rows(code=c), low) is not None:
            return c
    return None

