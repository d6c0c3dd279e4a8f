"""One way to replace an attribute of torch (or the stdlib) by a wrapper, and to undo it.

Every patch the harness and the instruments make goes through :class:`Patches`:

* ``wrap(owner, attr, make)`` saves the original, sets ``make(original)`` (marked with
  ``__wrapped__`` and, with ``tag``, ``_td_patch``), and remembers both;
* a second install of the same ``tag`` on an attribute that already holds one of our wrappers
  is refused (``None``): an original is never wrapped twice;
* ``undo()`` restores in reverse order, but only where the attribute still holds our wrapper:
  when someone else (the script, a library) patched on top after us, theirs stays, and ours,
  still under it, must be inert after teardown (every wrapper checks its instrument's state);
  an attribute that was inherited (not in the owner's own ``__dict__``) is deleted again
  rather than copied onto the owner.

Installs and undos happen in the child's main thread (harness start-up and teardown); the
lock only keeps two undos racing (a signal handler's teardown and the normal one) from
restoring twice.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_MISSING = object()
# code objects of our functions that call, on the user's behalf, what the user called (a patch's
# wrapper, a dispatch mode's ``__torch_dispatch__``): an exception passing through them is the
# user's (``runner/frames.py`` ``torchdoctor_origin``), one raised deeper in our code is ours
PASSTHROUGH_CODES: set = set()


def passthrough(fn: Any) -> Any:
    """Mark ``fn`` (a function, or an object whose class has ``__call__``) as a pass-through
    (see ``PASSTHROUGH_CODES``); returns ``fn`` (usable as a decorator)."""
    import types

    if isinstance(fn, (types.MethodType, classmethod, staticmethod)):
        fn = fn.__func__
    if isinstance(fn, types.FunctionType):
        code = fn.__code__
    else:  # an object: its class's __call__ (never ``fn.__code__``: a proxy answers the original's)
        call = getattr(type(fn), "__call__", None)
        code = call.__code__ if isinstance(call, types.FunctionType) else None
    if code is not None:
        PASSTHROUGH_CODES.add(code)
    return fn


def _own(owner: Any, attr: str) -> Any:
    try:
        return vars(owner).get(attr, _MISSING)
    except TypeError:  # an object without __dict__
        return getattr(owner, attr, _MISSING)


class Patches:
    """The patches of one instrument (or of the step clock), undone together."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, Any, Any, Any]] = []  # owner, attr, wrapper, orig, own
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._done)

    def wrap(self, owner: Any, attr: str, make: Callable[[Any], Any], tag: str | None = None,
             require: bool = True) -> Any:
        """Replace ``owner.attr`` by ``make(original)``; return the wrapper (``None`` when the
        attribute is missing and not ``require``d, or already wrapped with ``tag``)."""
        orig = getattr(owner, attr, _MISSING)
        if orig is _MISSING or orig is None:
            if require:
                raise AttributeError(f"{owner!r} has no attribute {attr!r} to patch")
            return None
        if tag is not None and getattr(orig, "_td_patch", None) == tag:
            return None
        wrapper = make(orig)
        self.set(owner, attr, wrapper, orig, tag)
        return wrapper

    def set(self, owner: Any, attr: str, wrapper: Any, orig: Any = _MISSING,
            tag: str | None = None) -> None:
        """Set an already built wrapper of ``orig`` (default: the current attribute)."""
        own = _own(owner, attr)
        if orig is _MISSING:
            orig = getattr(owner, attr)
        try:
            if getattr(wrapper, "__wrapped__", None) is None:
                wrapper.__wrapped__ = orig
            if tag is not None:
                wrapper._td_patch = tag
        except (AttributeError, TypeError):  # a builtin or a bound method: no attributes
            pass
        passthrough(wrapper)
        setattr(owner, attr, wrapper)
        with self._lock:
            self._done.append((owner, attr, wrapper, orig, own))

    def undo(self) -> None:
        """Restore every original still covered by our wrapper, last patch first."""
        with self._lock:
            done, self._done = self._done, []
        for owner, attr, wrapper, orig, own in reversed(done):
            try:
                if _own(owner, attr) is not wrapper:
                    continue  # patched on top by someone else: theirs stays, ours is inert
                if own is _MISSING:
                    delattr(owner, attr)  # it was inherited: the base class's shows again
                else:
                    setattr(owner, attr, own)  # the raw value (a staticmethod stays one)
            except Exception:  # noqa: BLE001 - teardown restores what it can
                pass
