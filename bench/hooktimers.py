"""Timing wrappers around methods, for the bench scripts that time hooks one by one
(``hook_timer.py``, ``nan_breakdown.py``): host seconds and calls per ``Class.method``."""

from __future__ import annotations

import collections
import functools
import time
from typing import Any


class HookTimers:
    """``wrap(cls, names)`` replaces each method by a timed wrapper; ``restore()`` puts the
    originals back. ``acc[key]``: seconds, ``cnt[key]``: calls, key ``Class.method``."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = collections.defaultdict(float)
        self.cnt: collections.Counter = collections.Counter()
        self._orig: list[tuple[Any, str, Any]] = []

    def wrap(self, cls: Any, names) -> None:
        acc, cnt = self.acc, self.cnt
        for n in names:
            fn = cls.__dict__.get(n)
            if fn is None or not callable(fn):
                continue
            key = f"{cls.__name__}.{n}"

            def mk(fn=fn, key=key):
                @functools.wraps(fn)
                def w(*args, **kw):
                    t = time.perf_counter()
                    try:
                        return fn(*args, **kw)
                    finally:
                        acc[key] += time.perf_counter() - t
                        cnt[key] += 1
                return w
            self._orig.append((cls, n, fn))
            setattr(cls, n, mk())

    def restore(self) -> None:
        for cls, n, fn in reversed(self._orig):
            setattr(cls, n, fn)
        self._orig = []

    def clear(self) -> None:
        self.acc.clear()
        self.cnt.clear()

    def lines(self, steps: int) -> list[str]:
        """'  12.3 us/step  1.0/step  Class.method', most time first."""
        return [f"  {self.acc[k] / steps * 1e6:8.1f} us/step  {self.cnt[k] / steps:5.1f}/step  {k}"
                for k in sorted(self.acc, key=lambda k: -self.acc[k])]
