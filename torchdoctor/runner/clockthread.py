"""Which thread the step clock follows (part of :class:`torchdoctor.runner.core.Core`).

The step clock follows one thread: the main thread, or, when the main thread does not train
(it has run no backward nor optimizer step, and waits for other threads: its innermost frames
are in ``threading``/``queue``/``concurrent.futures``..., e.g. ``join()``) at another thread's
step boundary, that thread (after ``ADOPT_AFTER`` such boundaries, the main thread doing
something else, the clock follows that thread all the same). Hooks called from other threads
(and after teardown began) return at once: instruments see one thread's loop, their state is
never shared between threads. ``ctx.in_owner_thread()`` tells instruments' own hooks the same.
:class:`StopRun` is raised only in the main thread: a script whose loop runs in another thread
is not cut at ``--steps`` (it runs to its end or to ``--timeout``), and no thread of the script
dies of torchdoctor's exception.
"""

from __future__ import annotations

import sys
import threading

_get_ident = threading.get_ident
# threads: another thread's boundaries seen while the main thread neither trained nor waited
# for other threads, after which the clock follows that thread all the same
ADOPT_AFTER = 64
_WAITING_MODULES = ("threading", "queue", "concurrent.futures", "multiprocessing", "asyncio")


class ThreadFollow:
    """Mixin of the core: ``_here`` / ``_fix_clock`` (state: ``ctx._train_tid``, ``main_tid``,
    ``main_trained``, ``foreign_boundaries``, ``closed``, set up by the core)."""

    def _here(self, training: bool = False) -> bool:
        """True when the calling thread is the one the step clock follows (module doc).
        ``training``: the call is backward or an optimizer step, which marks the main thread
        as training, or another thread as a trainer besides the clock's."""
        tid = _get_ident()
        clock = self.ctx._train_tid
        if tid == clock:
            return True
        if clock is None and tid == self.main_tid and not self.closed:
            if training:
                self.main_trained = True
            return True
        if training:
            self.ctx._other_trainers.add(tid)
        return False

    def _fix_clock(self) -> bool:
        """At a step boundary while no clock thread is fixed: the main thread's, or another
        thread's while the main thread does not train (module doc). True if the calling
        thread is now the clock's."""
        tid = _get_ident()
        if self.closed:
            return False
        if tid != self.main_tid:
            if self.main_trained:
                return False
            self.foreign_boundaries += 1
            if not self._main_waits() and self.foreign_boundaries < ADOPT_AFTER:
                return False
        self.ctx._train_tid = tid
        self.ctx._other_trainers.discard(tid)
        return True

    def _main_waits(self) -> bool:
        """The main thread is blocked waiting for others (``join()``, ``Event.wait()``, a
        queue, a future), not starting them: it does not train meanwhile."""
        f = sys._current_frames().get(self.main_tid)
        if f is None:
            return True
        waiting = False
        while f is not None:
            mod = f.f_globals.get("__name__", "")
            if not mod.startswith(_WAITING_MODULES):
                break
            if f.f_code.co_name == "start":  # Thread.start() waits for the thread to run
                return False
            waiting = True
            f = f.f_back
        return waiting
