"""torch's errors about the gradients a backward returned, classified (no torch).

The autograd engine checks what ``backward`` returns against the forward's inputs and raises
``RuntimeError`` with these texts (torch 2.x, ``torch/csrc/autograd``); a returned gradient of
another floating dtype is cast silently, so only the texts below are errors:

* count: ``function FooBackward returned an incorrect number of gradients (expected 2, got 1)``
* shape: ``Function FooBackward returned an invalid gradient at index 0 - got [3] but expected
  shape compatible with [4, 3]``
* device / dtype / layout: ``... returned an invalid gradient at index 0 - expected device cpu
  but got cuda:0`` (and ``expected dtype`` / ``expected type``)
* not a tensor: ``function FooBackward returned a gradient different than None at position 2,
  but the corresponding forward input was not a Variable``
"""

from __future__ import annotations

import re
from typing import Any

_COUNT = re.compile(r"(\w+) returned an incorrect number of gradients \(expected (\d+), got (\d+)\)")
_SHAPE = re.compile(r"(\w+) returned an invalid gradient at index (\d+) - got \[([^\]]*)\] but "
                    r"expected shape compatible with \[([^\]]*)\]")
_OTHER = re.compile(r"(\w+) returned an invalid gradient at index (\d+) - expected "
                    r"(device|dtype|type|layout|scalar type)\s+(\S+)\s+but got\s+(\S+)")
_NOT_TENSOR = re.compile(r"(\w+) returned a gradient different than None at position (\d+), but the "
                         r"corresponding forward input was not a Variable")


def classify(message: str) -> dict[str, Any] | None:
    """{kind, node, ...} for a returned-gradient error text, else None."""
    text = str(message or "")
    m = _COUNT.search(text)
    if m:
        return {"kind": "count", "node": m.group(1), "expected": int(m.group(2)),
                "got": int(m.group(3))}
    m = _SHAPE.search(text)
    if m:
        return {"kind": "shape", "node": m.group(1), "index": int(m.group(2)),
                "got": f"[{m.group(3)}]", "expected": f"[{m.group(4)}]"}
    m = _OTHER.search(text)
    if m:
        kind = "device" if m.group(3) == "device" else "layout" if m.group(3) == "layout" else "dtype"
        return {"kind": kind, "node": m.group(1), "index": int(m.group(2)),
                "expected": m.group(4), "got": m.group(5).rstrip(".,")}
    m = _NOT_TENSOR.search(text)
    if m:
        return {"kind": "not-a-tensor", "node": m.group(1), "position": int(m.group(2))}
    return None
