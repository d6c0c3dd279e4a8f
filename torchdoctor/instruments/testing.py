"""The recording context: the harness's own ``ctx`` with an in-memory writer, to drive instruments.

Tests run an instrument in their own process (``install``, a few steps of a tiny loop, the
callbacks by hand, ``uninstall``) against :class:`RecordingContext` instead of a fake of their
own: it *is* :class:`torchdoctor.runner.context.HarnessContext` (the same ``emit``,
``in_owner_process``/``in_owner_thread``, ``models()``, ``optimizers``, ``request_stop``,
``step``/``phase``), so an instrument cannot pass a test by leaning on a fake's looser answer.
What differs is only where the evidence goes:

* every ``ctx.emit(kind, **data)`` is kept as ``{"kind": kind, **data}`` in :attr:`events`
  (read them with :meth:`of` and :meth:`last`), after a check that the data is JSON
  (``strict_json``, default on: no ``str()`` fallback hides a tensor or a path in evidence);
* ``artifact`` events (files an instrument wrote) are read back with :meth:`artifacts`; the run
  dir is ``run_dir`` when given, else a temporary folder removed with the context
  (:meth:`close`, or at garbage collection);
* what the step clock would have seen is told by the test: :meth:`saw_model`,
  :meth:`saw_optimizer`, ``ctx.step``/``ctx.phase`` set directly.

The owner thread is the thread that made the context (the harness's is the main thread until
its clock adopts another); :meth:`train_in_this_thread` moves it, as the clock's adoption does.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from torchdoctor.runner.context import HarnessContext


class RecordingWriter:
    """The evidence writer's interface (``write``, ``close``), kept in memory."""

    def __init__(self, strict_json: bool = True):
        self.events: list[dict[str, Any]] = []
        self.strict_json = strict_json

    def write(self, kind: str, **data: Any) -> None:
        if self.strict_json:
            json.dumps(data, allow_nan=True)  # evidence must be JSON-able (TypeError if not)
        self.events.append({"kind": kind, **data})

    def close(self) -> None:
        pass


class RecordingContext(HarnessContext):
    """A :class:`HarnessContext` whose evidence is kept in :attr:`events`."""

    def __init__(self, probe: str = "run", options: dict[str, Any] | None = None,
                 run_dir: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
                 *, models: tuple = (), optimizers: tuple = (), strict_json: bool = True):
        self._tmp = None if run_dir is not None else tempfile.TemporaryDirectory(prefix="td-rec-")
        opts = dict(options or {})
        if out_dir is not None:
            opts["out"] = str(out_dir)
        self.writer = RecordingWriter(strict_json)
        super().__init__(probe, run_dir if run_dir is not None else self._tmp.name, opts, self.writer)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.train_in_this_thread()
        for m in models:
            self.saw_model(m)
        for o in optimizers:
            self.saw_optimizer(o)

    # -- what was recorded ------------------------------------------------------------------
    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event emitted so far, in order: ``{"kind": kind, **data}``."""
        return self.writer.events

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind, in order."""
        return [e for e in self.writer.events if e["kind"] == kind]

    def last(self, kind: str) -> dict[str, Any]:
        """The last event of ``kind`` (``LookupError`` when there is none)."""
        found = self.of(kind)
        if not found:
            raise LookupError(f"no {kind!r} event among {sorted({e['kind'] for e in self.events})}")
        return found[-1]

    def artifacts(self) -> dict[str, Path]:
        """The files instruments reported writing (``artifact`` events), by name."""
        return {e["name"]: Path(e["path"]) for e in self.of("artifact")}

    # -- what the step clock would have seen ----------------------------------------------
    def saw_model(self, module: Any) -> None:
        """A root module seen in forward (``ctx.models()``)."""
        self._add_model(module)

    def saw_optimizer(self, optimizer: Any) -> None:
        """An optimizer seen stepping (``ctx.optimizers``)."""
        self._add_optimizer(optimizer)

    def train_in_this_thread(self) -> None:
        """The calling thread becomes the one whose training is measured (``in_owner_thread``)."""
        self._train_tid = threading.get_ident()

    def close(self) -> None:
        """Remove the temporary run dir (when the context made one)."""
        if self._tmp is not None:
            self._tmp.cleanup()
