"""Cheap literal gates for regexes, so a fresh process compiles only the patterns that can match.

Compiling the ~60 symptom regexes costs more than matching them (``re`` compiles in Python).
``required_literals(pattern)`` splits a pattern at its top-level ``|`` and, for each alternative,
takes the longest run of characters that every match of that alternative must contain (outside
groups and classes, not made optional by ``?``, ``*`` or ``{0,n}``). If every alternative has such
a literal of ``MIN_GATE`` characters or more, the pattern is compiled only when the (normalised)
text contains one of them; otherwise the gate is ``None`` (always compile). Sound by construction
for the regex subset used here; ``tests/test_ask_matcher.py`` also checks gated == ungated results.
"""

from __future__ import annotations

MIN_GATE = 3
_CLASS_ESCAPES = set("bBsSwWdDAZ")
_SPECIAL = set(".^$")


def _split_top(pattern: str) -> list[str]:
    parts, depth, i, start, n = [], 0, 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _skip_class(pattern, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _skip_class(p: str, i: int) -> int:
    """Index just after the character class starting at p[i] == '['."""
    i += 1
    if i < len(p) and p[i] == "^":
        i += 1
    if i < len(p) and p[i] == "]":
        i += 1
    while i < len(p) and p[i] != "]":
        i += 2 if p[i] == "\\" else 1
    return i + 1


def _optional_quantifier(p: str, i: int) -> bool:
    """Does the quantifier at p[i] (if any) allow zero repetitions?"""
    if i >= len(p):
        return False
    if p[i] in "?*":
        return True
    if p[i] == "{":
        j = p.find("}", i)
        body = p[i + 1:j] if j > 0 else ""
        return body.split(",")[0].strip() in ("", "0")
    return False


def _alternative_options(alt: str) -> list[frozenset[str]]:
    """Sets S such that every match of ``alt`` contains some member of S.

    Literal runs at depth 0 give singletons; a required, non-lookaround group whose own
    alternatives all have gates gives the union of those gates.
    """
    opts: list[frozenset[str]] = []
    cur: list[str] = []
    i, n = 0, len(alt)

    def flush():
        if cur:
            run = "".join(cur)
            if len(run) >= MIN_GATE:
                opts.append(frozenset((run,)))
            cur.clear()

    while i < n:
        c = alt[i]
        if c == "\\" and i + 1 < n:
            e = alt[i + 1]
            if e not in _CLASS_ESCAPES and not e.isalnum() and not _optional_quantifier(alt, i + 2):
                cur.append(e)
            else:
                flush()
            i += 2
            continue
        if c == "[":
            flush()
            i = _skip_class(alt, i)
            continue
        if c == "{":  # a counted quantifier: its digits are not literals
            flush()
            j = alt.find("}", i)
            i = j + 1 if j > 0 else n
            continue
        if c == "(":
            flush()
            end = _group_end(alt, i)
            body = alt[i + 1:end]
            lookaround = body.startswith(("?=", "?!", "?<=", "?<!"))
            if body.startswith("?:"):
                body = body[2:]
            if not lookaround and not _optional_quantifier(alt, end + 1):
                g = _gates(body)
                if g is not None:
                    opts.append(g)
            i = end + 1
            continue
        if c not in _SPECIAL and c not in "?*+}|)" and not _optional_quantifier(alt, i + 1):
            cur.append(c)
        else:
            flush()
        i += 1
    flush()
    return opts


def _group_end(p: str, i: int) -> int:
    """Index of the ')' closing the group opened at p[i]."""
    depth, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _skip_class(p, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def _gates(pattern: str) -> frozenset[str] | None:
    out: set[str] = set()
    for alt in _split_top(pattern):
        opts = _alternative_options(alt)
        if not opts:
            return None
        out |= max(opts, key=lambda s: (min(len(x) for x in s), -len(s)))
    return frozenset(out)


def required_literals(pattern: str) -> frozenset[str] | None:
    """Literals one of which every match of ``pattern`` contains; None when that cannot be shown."""
    return _gates(pattern)
