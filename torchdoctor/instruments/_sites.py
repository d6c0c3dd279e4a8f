"""Where the user made an object: the call site of a constructor or a mode switch, kept aside.

Used by the training instruments to give ``file:line`` to findings that name a parameter, an
optimizer or a module: ``Module.__init__`` and ``Optimizer.__init__`` are wrapped to remember
the user's line that built the object (the line calling ``nn.Linear(...)`` or
``torch.optim.AdamW(...)``, not the ``super().__init__()`` inside a user's own subclass), and
``Module.train`` the line that called ``model.eval()`` / ``model.train(False)``.

Nothing is stored on the user's objects (they must pickle and deepcopy as without
torchdoctor): sites live in a dict keyed by ``id`` with a weak reference that proves the
object is still the one seen. Cost: one walk up the Python stack per constructed module or
optimizer (a few frames; ``f_locals`` is read only on the user's own ``__init__`` frames) and
per outermost ``train()`` call.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any


def creation_site(obj: Any, depth: int = 2) -> str | None:
    """"file:line" of the nearest user frame above ``depth`` that is not ``obj``'s own __init__."""
    from torchdoctor.runner.frames import is_user_file

    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    hops = 0
    while f is not None and hops < 64:
        hops += 1
        co = f.f_code
        if is_user_file(co.co_filename):
            if co.co_name == "__init__" and co.co_varnames[:1] == ("self",):
                try:
                    if f.f_locals.get("self") is obj:  # the object's own constructor chain
                        f = f.f_back
                        continue
                except Exception:  # noqa: BLE001
                    pass
            return f"{co.co_filename}:{f.f_lineno}"
        f = f.f_back
    return None


def call_site(depth: int = 2) -> str | None:
    """"file:line" of the nearest user frame above ``depth``."""
    from torchdoctor.runner.frames import is_user_file

    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    while f is not None:
        co = f.f_code
        if is_user_file(co.co_filename):
            return f"{co.co_filename}:{f.f_lineno}"
        f = f.f_back
    return None


class SiteBook:
    """id(obj) -> (weak reference, site). Objects that refuse weak references are not kept."""

    def __init__(self) -> None:
        self._sites: dict[int, tuple[Any, Any]] = {}

    def put(self, obj: Any, site: Any) -> None:
        try:
            ref = weakref.ref(obj)
        except TypeError:
            return
        self._sites[id(obj)] = (ref, site)

    def get(self, obj: Any) -> Any:
        hit = self._sites.get(id(obj))
        if hit is None or hit[0]() is not obj:
            return None
        return hit[1]

    def items(self):
        for ref, site in list(self._sites.values()):
            obj = ref()
            if obj is not None:
                yield obj, site

    def __len__(self) -> int:
        return len(self._sites)
