"""JSON rendering of a Report (docs/contract.md, schema 1). One object, nothing else on stdout."""

from __future__ import annotations

import json
import math
from typing import Any


def _clean(obj: Any) -> Any:
    """Make evidence JSON-safe: NaN/Inf floats become strings, tuples lists, unknowns str."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, int) and not isinstance(obj, bool) and obj.bit_length() > 4000:
        return f"<integer of about {int(obj.bit_length() * 0.30103)} digits>"  # str() refuses > 4300
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def dumps(data: dict[str, Any]) -> str:
    from torchdoctor.safe import json_visible

    return json_visible(json.dumps(_clean(data), indent=2, ensure_ascii=False))


def render_json(report) -> str:
    return dumps(report.to_dict())


def _render_dict(data: dict[str, Any]) -> str:
    return dumps(data) + "\n"


def _format():
    from torchdoctor.report.formats import Format

    return Format("json", ".json", '"tool": "torchdoctor"', _render_dict)


def __getattr__(name: str):  # FORMAT, built on first use (report/formats.py imports this module)
    if name == "FORMAT":
        return _format()
    raise AttributeError(name)
