"""Hooks that torchdoctor puts on the user's own modules, made harmless to copy and to pickle.

"First, do no harm": a script that snapshots its model (``copy.deepcopy(model)`` for an EMA
or the best model) or saves it whole (``torch.save(model)``) must do so under torchdoctor
exactly as without it. A hook registered on a module lives in the module's ``__dict__``
(``_forward_hooks`` ...), so both copy it; a bound method of an instrument drags the
instrument along (its evidence file, ``torch`` itself, locks), which neither can copy, and
the script died of it. Two layers keep that from happening:

* :func:`install_state_filter` patches ``torch.nn.Module.__getstate__`` (the class, never a
  user's object) to leave every :class:`UserHook` out of the state it returns: pickling and
  ``deepcopy`` both take the state from there, so the copy and the saved file are exactly
  what they would be without torchdoctor (no hook; nothing that names torchdoctor);
* hooks go only on modules whose copies take their state from there (:func:`hookable`); for
  a class with its own ``__getstate__`` (``nn.LSTM``; a model that drops a lock from its
  state), which would copy the hook dicts as they are, the instruments use a global module
  hook that checks the module instead;
* should a :class:`UserHook` travel all the same, it copies to a hook that does nothing
  (``deepcopy``) and pickles to ``functools.partial(sys.audit, "torchdoctor.detached_hook")``:
  a no-op callable that any Python can load without torchdoctor installed.

A :class:`UserHook` also becomes a no-op once :meth:`UserHook.detach` ran (the instruments'
teardown), so a hook a copy or another thread still holds never reaches a removed instrument.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

# the hook registries of nn.Module, and their id-keyed companions
HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
              "_load_state_dict_post_hooks")
ID_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called")
DETACHED_EVENT = "torchdoctor.detached_hook"


class UserHook:
    """A callable wrapping an instrument's hook ``fn`` for registration on a user's object."""

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[..., Any] | None):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.fn
        if fn is None:
            return None
        return fn(*args, **kwargs)

    def detach(self) -> None:
        """From now on a no-op (the instrument is being removed)."""
        self.fn = None

    def __deepcopy__(self, memo: dict) -> "UserHook":
        return UserHook(None)

    def __copy__(self) -> "UserHook":
        return UserHook(None)

    def __reduce__(self) -> tuple:
        return (functools.partial, (sys.audit, DETACHED_EVENT))

    def __repr__(self) -> str:
        return f"<torchdoctor hook{' (detached)' if self.fn is None else ''}>"


def strip_user_hooks(state: dict) -> dict:
    """``state`` (a module's ``__dict__`` copy) without :class:`UserHook` entries; the hook
    dicts that held one are replaced by filtered copies (the module's own stay intact)."""
    removed: set[int] = set()
    for name in HOOK_DICTS:
        d = state.get(name)
        if not d:
            continue
        ours = [k for k, h in d.items() if isinstance(h, UserHook)]
        if not ours:
            continue
        new = d.copy()
        for k in ours:
            del new[k]
        state[name] = new
        removed.update(ours)
    if removed:
        for name in ID_DICTS:
            d = state.get(name)
            if d and any(k in removed for k in d):
                new = d.copy()
                for k in removed:
                    new.pop(k, None)
                state[name] = new
    return state


def install_state_filter() -> Callable[[], None]:
    """Patch ``nn.Module.__getstate__`` to drop :class:`UserHook` entries; returns the undo."""
    from torch import nn

    from torchdoctor.runner.patching import Patches

    Module = nn.Module
    if Module.__dict__.get("__getstate__") is None:
        return lambda: None

    def make(orig):
        def __getstate__(self):  # noqa: N807 - the patched dunder
            state = orig(self)
            if isinstance(state, dict) and state is not self.__dict__:
                return strip_user_hooks(state)
            return state

        __getstate__.__qualname__ = orig.__qualname__
        return __getstate__

    patches = Patches()  # undone only where our wrapper is still on top
    patches.wrap(Module, "__getstate__", make, tag="strips-hooks")
    return patches.undo


def hookable(module: Any) -> bool:
    """True when a copy or pickle of ``module`` takes its state from ``nn.Module.__getstate__``
    (which :func:`install_state_filter` filters): its class overrides none of
    ``__getstate__``, ``__reduce__``, ``__reduce_ex__``, ``__deepcopy__``. Otherwise (``nn.LSTM``,
    a class that drops a lock from its state) hooks stay off the module: a global hook that
    checks the module stands in, which costs more but leaves nothing on it."""
    from torch import nn

    from torchdoctor import torch_internals as ti

    cls = type(module)
    if cls is ti.dynamo_wrapper_class():
        # torch.compile's wrapper: its __reduce__ rebuilds it from the wrapped module alone, so
        # a copy or pickle never carries the wrapper's own hooks; and dynamo does not guard on
        # them (a global hook added instead would make every compiled function recompile)
        return True
    Module = nn.Module
    return (getattr(cls, "__getstate__", None) is Module.__getstate__
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and getattr(cls, "__deepcopy__", None) is None)


def register_on(module: Any, kind: str, fn: Callable[..., Any], **kw: Any) -> tuple[Any, UserHook]:
    """Register ``fn`` on ``module`` as a :class:`UserHook` (``kind``: "forward_pre" or
    "forward"); returns (handle, hook). ``always_call`` is dropped on a torch without it."""
    hook = UserHook(fn)
    reg = getattr(module, f"register_{kind}_hook")
    try:
        handle = reg(hook, **kw)
    except TypeError:
        if "always_call" not in kw:
            raise
        kw = {k: v for k, v in kw.items() if k != "always_call"}
        handle = reg(hook, **kw)
    return handle, hook

