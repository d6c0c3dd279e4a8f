"""The harness context ``ctx`` handed to every instrument inside the child process.

One object per run. Instruments read the clock state (``step``, ``phase``), write evidence
(``emit``), look at what the script built (``optimizers``, ``models()``) and may end the run
cleanly (``request_stop``). Everything here is cheap: it is called from inside the user's step.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer", "other")
_getpid = os.getpid
_get_ident = threading.get_ident


class StopRun(BaseException):
    """Raised at a step boundary to end the script cleanly (``--steps`` reached, ``request_stop``).

    A ``BaseException`` so that the user's ``except Exception`` blocks do not swallow it.
    Raised in the main thread only: a thread of the script never dies of it.
    """


class HarnessContext:
    """State shared by the harness core and the instruments (see runner_shared contract)."""

    def __init__(self, probe: str, run_dir: str | os.PathLike, options: dict[str, Any], writer: Any):
        self.probe = probe
        self.run_dir = Path(run_dir)
        self.options: dict[str, Any] = dict(options or {})
        out = self.options.get("out")
        self.out_dir: Path | None = Path(out) if out else None
        self.step = 0  # completed optimizer steps (or backward calls in fallback mode)
        self.phase = "other"  # maintained by the step clock
        self.stop_reason: str | None = None
        # the tensor(s) passed to the outermost backward in progress ("the loss"); set by the
        # core's backward wrapper before on_backward_begin, dropped when that backward ends
        self.last_backward_tensor: Any = None
        self._writer = writer
        self._owner_pid = os.getpid()
        # the thread whose training the step clock follows (see runner/core.py, "Threads"):
        # the main thread until the clock adopts another one; threads seen training besides
        self._main_tid = threading.main_thread().ident
        self._train_tid: int | None = None
        self._other_trainers: set[int] = set()
        self._optimizers: list[weakref.ref] = []
        self._optimizer_ids: set[int] = set()
        self._models: list[weakref.ref] = []
        self._model_ids: set[int] = set()

    # -- evidence -------------------------------------------------------------------------
    def emit(self, kind: str, **data: Any) -> None:
        """Append one evidence event (flushed at once). Ignored in forked DataLoader workers."""
        if os.getpid() != self._owner_pid:
            return
        self._writer.write(kind, **data)

    def in_owner_process(self) -> bool:
        """False inside forked DataLoader workers, which inherit the global hooks."""
        return os.getpid() == self._owner_pid

    def in_owner_thread(self) -> bool:
        """True in the owner process *and* the thread whose training is measured (the main
        thread, or the one thread that trains when the main thread does not). Hooks that
        instruments register themselves return at once elsewhere: their state is not shared
        between threads, and another thread's steps are not this run's steps."""
        return (_get_ident() == (self._train_tid or self._main_tid)
                and _getpid() == self._owner_pid)

    def other_trainers_alive(self) -> int:
        """How many other threads seen training (backward, optimizer step) are still alive."""
        if not self._other_trainers:
            return 0
        alive = {t.ident for t in threading.enumerate()}
        return len(self._other_trainers & alive)

    # -- control --------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """End the run cleanly at the next step boundary (first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    # -- what the script built --------------------------------------------------------------
    def _add_optimizer(self, opt: Any) -> None:
        if id(opt) in self._optimizer_ids:
            return
        self._optimizer_ids.add(id(opt))
        self._optimizers.append(weakref.ref(opt))

    def _add_model(self, module: Any) -> bool:
        """Record a root module; True if it was new."""
        if id(module) in self._model_ids:
            return False
        self._model_ids.add(id(module))
        try:
            self._models.append(weakref.ref(module))
        except TypeError:
            return False
        return True

    @property
    def optimizers(self) -> list[Any]:
        """The torch optimizers seen stepping so far (still alive), in first-step order."""
        return [o for o in (r() for r in self._optimizers) if o is not None]

    @property
    def models_seen(self) -> int:
        """How many root modules were ever recorded: changes exactly when ``models()`` may
        hold a new one (a cheap "anything new?" test for per-step hooks)."""
        return len(self._model_ids)

    def models(self) -> list[Any]:
        """Root ``nn.Module`` objects seen in forward so far (called while no other module ran).

        Loss modules called at top level (``nn.CrossEntropyLoss()``) are roots too; filter on
        ``any(True for _ in m.parameters())`` when you need models with weights.
        """
        return [m for m in (r() for r in self._models) if m is not None]
