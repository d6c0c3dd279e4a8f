"""Instruments: measurement installed inside the child process around the user's script.

An instrument writes evidence (``ctx.emit``); it never judges. The harness core owns the
patches that see the training loop (global optimizer step hooks, the backward wrapper, the
DataLoader iterator wrapper) and calls each armed instrument's callbacks; an instrument
overrides only the callbacks it needs (only overridden ones are dispatched, so an unused
callback costs nothing on the hot path).

Register a class with :func:`register`; ``produces`` names the evidence kinds it is the source
of (e.g. ``{"mem", "mem_info"}``). Which probes arm it is derived, not listed: a probe arms the
instruments that produce a kind its rules need (:func:`instruments_producing`, called with the
probe's needs: ``torchdoctor.pipeline.registry.instruments_for``). Kinds an instrument
only adds to, that another instrument is the source of (details for the crash finding in a
``crash_context``, ``artifact`` files, ``instrument_error``), are not in its ``produces``: they
must not arm it. Modules in this package are discovered automatically.

Rules for code that runs inside the user's step: no device sync unless the instrument's
docs say why (at most one per step), aggregate per step, return at once from hooks you
register yourself unless ``ctx.in_owner_thread()`` (not in forked DataLoader workers, not in
the script's other threads: instrument state is never shared between threads; the core's
callbacks come from that thread only), leave nothing on the user's objects that a
``deepcopy`` or ``torch.save`` of them would carry (``runner/userhooks.py``), and never raise
into the user's code (the harness catches and reports instrument failures, but a failure
still costs the measurement).
"""

from __future__ import annotations

from typing import Any, Iterable

from torchdoctor.discovery import import_submodules

CALLBACKS = (
    "on_step_end",  # (ctx, step): an optimizer step finished; step = completed steps (1-based)
    "on_backward_begin",  # (ctx): torch.autograd.backward / Tensor.backward entered (outermost)
    "on_backward_end",  # (ctx): that backward returned
    "on_batch",  # (ctx, wait_s): the DataLoader iterator returned a batch after wait_s seconds
    "on_crash",  # (ctx, exc): the script raised exc (before uninstall)
)


class Instrument:
    """Base class. Subclasses set ``name``, ``produces`` and override what they need."""

    name: str = ""
    produces: frozenset[str] = frozenset()  # the evidence kinds it writes (``ctx.emit``)
    priority: int = 50  # dispatch order, lower first (the step clock runs first)
    _hook_failed: bool = False  # set by :meth:`hook_failed`

    def install(self, ctx: Any) -> None:
        """Install hooks. Called once before the script runs."""

    def uninstall(self, ctx: Any) -> None:
        """Remove hooks and write final summaries. Called in ``finally``, also after a crash."""

    def overrides(self, callback: str) -> bool:
        return getattr(type(self), callback, None) is not getattr(Instrument, callback, None)

    def on_step_end(self, ctx: Any, step: int) -> None: ...

    def on_backward_begin(self, ctx: Any) -> None: ...

    def on_backward_end(self, ctx: Any) -> None: ...

    def on_batch(self, ctx: Any, wait_s: float) -> None: ...

    def on_crash(self, ctx: Any, exc: BaseException) -> None: ...

    def hook_failed(self, ctx: Any, callback: str) -> None:
        """Call from ``except Exception`` in a hook this instrument registered itself (a global
        module or optimizer hook, which the core does not wrap): reports the failure once, as
        the core does for its callbacks (an ``instrument_error`` event: an internal-error
        finding), and removes the instrument's hooks (``self.handles``) so that the user's
        script goes on unharmed and unmeasured by it."""
        import traceback

        if self._hook_failed:
            return
        self._hook_failed = True
        ctx.emit("instrument_error", instrument=self.name, callback=callback,
                 traceback=traceback.format_exc(limit=8))
        for h in getattr(self, "handles", None) or []:
            h.remove()
        self.handles = []


_REGISTRY: dict[str, type[Instrument]] = {}


def register(cls: type[Instrument]) -> type[Instrument]:
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if "probes" in vars(cls):
        raise ValueError(f"instrument {cls.name}: declare the evidence it produces (`produces`), "
                         f"not the probes that arm it (derived from the rules' needs)")
    if not cls.produces or not isinstance(cls.produces, frozenset):
        raise ValueError(f"instrument {cls.name}: `produces` must be a non-empty frozenset of "
                         f"evidence kinds")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"instrument registered twice: {cls.name}")
    _REGISTRY[cls.name] = cls
    return cls


def all_instruments() -> dict[str, type[Instrument]]:
    import_submodules(__name__, __path__)
    return dict(_REGISTRY)


def instruments_producing(needs: Iterable[str]) -> list[type[Instrument]]:
    """Instrument classes that produce one of the evidence kinds ``needs``, in dispatch order."""
    wanted = frozenset(needs)
    found = [c for c in all_instruments().values() if c.produces & wanted]
    return sorted(found, key=lambda c: (c.priority, c.name))

