"""How much of one evidence value a report shows: the same bounds in every renderer.

A finding's evidence is data that can be huge (a node's summary sent a 7.8 MB string as one
value; a dict can nest 900 levels). The console and the HTML page show each value through
:func:`bounded` first, and the evidence gathered from another node is bounded the same way when
node 0 reads it (so its JSON report holds the same cut values). What is cut is said in place:
``… (+N)`` at the end of a list, ``"…": "+N keys"`` in a dict, ``… (N characters in all)`` at the
end of a string, ``…`` for what lies deeper than ``MAX_DEPTH``.
"""

from __future__ import annotations

import re
from typing import Any

MAX_VALUE_CHARS = 2000  # characters of one string
MAX_LIST_ITEMS = 50  # items of one list
MAX_DICT_KEYS = 20  # keys of one dict
MAX_DEPTH = 6  # nesting of lists and dicts inside one evidence value
MORE = "…"


_CUT = re.compile(MORE + r" \(\d+ characters in all\)\Z")


def cut_text(s: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``s`` cut at ``limit`` characters, saying so; a text this cut already is kept as it is
    (node 0 bounds a gathered value, then its renderer bounds it again)."""
    if len(s) <= limit or (len(s) <= limit + 40 and _CUT.search(s)):
        return s
    return f"{s[:limit]}{MORE} ({len(s)} characters in all)"


def bounded(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` within the bounds above (numbers, booleans and None as they are;
    tuples as lists; any other object as its capped ``str``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
        return f"<integer of about {int(value.bit_length() * 0.30103)} digits>"  # str() refuses
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return cut_text(value)
    if isinstance(value, (list, tuple, dict)) and depth >= MAX_DEPTH:
        return MORE
    if isinstance(value, (list, tuple)):
        out = [bounded(v, depth + 1) for v in value[:MAX_LIST_ITEMS]]
        if len(value) > MAX_LIST_ITEMS:
            out.append(f"{MORE} (+{len(value) - MAX_LIST_ITEMS})")
        return out
    if isinstance(value, dict):
        items = list(value.items())
        out_d = {cut_text(str(k), 200): bounded(v, depth + 1) for k, v in items[:MAX_DICT_KEYS]}
        if len(items) > MAX_DICT_KEYS:
            out_d[MORE] = f"+{len(items) - MAX_DICT_KEYS} keys"
        return out_d
    try:
        return cut_text(str(value))
    except Exception as e:  # noqa: BLE001 - an object whose str() fails is shown as such
        return f"<{type(value).__name__}: str() failed: {type(e).__name__}>"
