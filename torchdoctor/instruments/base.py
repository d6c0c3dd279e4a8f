"""The instrument contract: what an instrument class declares, what it implements, how it fails.

An instrument is measurement installed inside the child process around the user's script. It
writes evidence (``ctx.emit``); it never judges. Every instrument in the sub-packages of
:mod:`torchdoctor.instruments` is one :class:`Instrument` subclass registered with
:func:`register`; this module is the only statement of the contract.

**Declares** (class attributes, checked by :func:`register` when the module is imported):

* ``name``: unique, the name ``TORCHDOCTOR_DISABLE=name`` and ``instrument_error`` events use
  (by convention the module's own name);
* ``produces``: a non-empty ``frozenset`` of the evidence kinds it is the *source* of (e.g.
  ``{"mem", "mem_info"}``). Which probes arm it is derived, never listed (a ``probes``
  attribute is refused): a probe arms the instruments that produce a kind its rules need
  (``torchdoctor.pipeline.registry.instruments_for``, computed in the parent; the child arms
  :func:`torchdoctor.instruments.instruments_producing` of the needs in ``meta.json``). Kinds
  it only adds to, that another instrument is the source of (details for the crash finding
  in a ``crash_context``, ``artifact`` files, ``instrument_error``), are not in ``produces``:
  they must not arm it;
* ``priority``: dispatch order, lower first (default 50; the step clock runs first).

**Implements** (each optional; the base does nothing):

* ``install(ctx)``: once, before the script runs; registers the hooks and patches it needs
  (patches on torch or user classes through ``runner/patching.py``);
* ``uninstall(ctx)``: once, in ``finally`` (also after a crash or a stop), in reverse dispatch
  order: removes everything ``install`` put in place and emits the final summaries;
* the callbacks of :data:`CALLBACKS`, called by the harness core (``runner/core.py``), which
  owns the patches that see the training loop (global optimizer step hooks, the backward
  wrapper, the DataLoader iterator wrapper). Only callbacks a class overrides are dispatched
  (:meth:`Instrument.overrides`), so an unused callback costs nothing on the hot path.

**The context** ``ctx`` (``runner/context.py`` ``HarnessContext``; in tests
:class:`torchdoctor.instruments.testing.RecordingContext`, the same class with an in-memory
writer): ``emit(kind, **data)`` (JSON-able data; ignored in forked DataLoader workers),
``step``, ``phase``, ``options``, ``probe``, ``run_dir``/``out_dir`` (artifacts),
``optimizers``, ``models()``/``models_seen``, ``last_backward_tensor``, ``in_owner_process()``,
``in_owner_thread()``, ``other_trainers_alive()``, ``request_stop(reason)``.

**Errors.** An instrument never raises into the user's code. The core calls ``install``,
``uninstall`` and every callback guarded: one that raises is reported once as an
``instrument_error`` event (an ``internal-error`` finding in the parent) and that callback of
that instrument is not called again; the script goes on. Hooks an instrument registers itself
(global module or optimizer hooks, wrappers) are not guarded by the core: catch ``Exception``
there and call :meth:`Instrument.hook_failed`, which reports the same way and removes the
instrument's ``self.handles``. A bad declaration is a ``ValueError`` from :func:`register`, at
import (caught by the tests, never in a user's run).

**In the user's step**: no device sync unless the instrument's docs say why (at most one per
step), aggregate per step, return at once from hooks you register yourself unless
``ctx.in_owner_thread()`` (not in forked DataLoader workers, not in the script's other threads:
instrument state is never shared between threads; the core's callbacks come from that thread
only), leave nothing on the user's objects that a ``deepcopy`` or ``torch.save`` of them would
carry (``runner/userhooks.py``), and import torch and anything heavy inside ``install`` or the
callbacks, never at module level (discovery imports every instrument module in the child).
"""

from __future__ import annotations

from typing import Any

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


def registered() -> dict[str, type[Instrument]]:
    """The classes registered so far (discovery: :func:`torchdoctor.instruments.all_instruments`)."""
    return dict(_REGISTRY)
