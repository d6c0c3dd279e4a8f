"""Run collectors side by side, each bounded by its own timeout; failures become data.

A collector is a plain function returning a JSON-able dict (or raising). The runner starts
every collector in a daemon thread at once and waits for each until ``start + timeout``.
A collector that raises or is still running at its deadline is reported as
``{"error": "could not collect: ..."}``; nothing it does can hang or crash the caller.
A timed-out thread is abandoned (Python cannot kill a thread): it is a daemon, so it never
holds up interpreter exit, and its late result is discarded.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

ERROR_PREFIX = "could not collect: "


@dataclass(frozen=True)
class Collector:
    name: str
    fn: Callable[[], Any]
    timeout_s: float = 5.0


def failed(reason: str) -> dict[str, str]:
    """The value a collector that could not collect is replaced with."""
    return {"error": ERROR_PREFIX + reason}


def is_failed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"error"} and str(value["error"]).startswith(ERROR_PREFIX)


def describe_exception(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def run_collectors(collectors: list[Collector], scale: float = 1.0) -> tuple[dict[str, Any], dict[str, float]]:
    """Run ``collectors`` concurrently; return ({name: value or failure}, {name: seconds}).

    ``scale`` multiplies every timeout (tests use small values). Seconds are wall time from
    the common start to the collector's end (or to its deadline when it timed out).
    """
    start = time.monotonic()
    boxes: list[tuple[Collector, threading.Thread, dict[str, Any]]] = []
    for c in collectors:
        box: dict[str, Any] = {}
        t = threading.Thread(target=_call, args=(c.fn, box), name=f"torchdoctor-env-{c.name}", daemon=True)
        t.start()
        boxes.append((c, t, box))
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for c, t, box in boxes:
        limit = c.timeout_s * scale
        t.join(max(0.0, start + limit - time.monotonic()))
        if t.is_alive():
            results[c.name] = failed(f"timed out after {limit:g} s")
            timings[c.name] = round(limit, 3)
        elif "exc" in box:
            results[c.name] = failed(describe_exception(box["exc"]))
            timings[c.name] = round(box["end"] - start, 3)
        else:
            results[c.name] = box.get("value")
            timings[c.name] = round(box["end"] - start, 3)
    return results, timings


def _call(fn: Callable[[], Any], box: dict[str, Any]) -> None:
    try:
        box["value"] = fn()
    except BaseException as e:  # noqa: BLE001 - a collector must never take the command down
        box["exc"] = e
    finally:
        box["end"] = time.monotonic()
