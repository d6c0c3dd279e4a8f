"""Dynamo diagnostics: graph breaks, recompiles, the recompile limit and compile time, per step.

Armed by ``torchdoctor compile`` (and by a ``treat`` trial that adds
:data:`torchdoctor.compilecheck.DIAG_NEEDS`); the script is not edited and prints nothing more.

* **Dynamo's own reasons, switched on from outside.** A logging handler on dynamo's
  ``graph_breaks`` and ``recompiles`` artifact loggers (the channels of
  ``TORCH_LOGS=graph_breaks,recompiles``), set to DEBUG and — unless the user switched them on
  — not propagated, so nothing reaches the terminal; and a handler on the logger of the
  "hit config.recompile_limit" warning (its level untouched: the user still sees that line).
  Each message is read into fields (:mod:`torchdoctor.compilecheck.text`) and emitted at once.
  The loggers are created by name before dynamo is imported (the first compile happens
  inside the first step) and re-checked at each step end (a ``set_logs`` in the script resets
  them).
* **Compile records.** At each step end, the compile records dynamo appended since the last
  one (``get_compilation_metrics``: function, seconds, failure and its user line, whether the
  frame kept compiled code, the recompile reason), and whether anything was compiled in the
  step (dynamo's timed compile phases grew, backward compiles included): a ``dynamo_step`` event
  names the steps whose time includes compiling, which the step-time figures leave out.

Events: ``dynamo_break`` {step, file, line, reason, what, hint, gb, url, skip, duplicate},
``dynamo_recompile`` {step, function, file, line, guard, user_file, user_line},
``dynamo_limit`` {step, limit, value, function, file, line, guard, user_file, user_line},
``dynamo_compile`` {step, id, function, file, line, seconds, forward, fail, fail_reason,
fail_file, fail_line, guarded, recompile_guard, ops}, ``dynamo_step`` {step, records, compile_s}.
Cost: nothing per op; per step a look at two of dynamo's counters (a few µs); per compile
event one message parsed.
"""

from __future__ import annotations

import logging
from typing import Any

from torchdoctor import torch_internals as ti
from torchdoctor.instruments.base import Instrument, register

MAX_EVENTS = 2000  # per kind: a pathological script cannot flood the evidence


@register
class DynamoDiag(Instrument):
    name = "dynamo_diag"
    produces = frozenset({"dynamo_break", "dynamo_recompile", "dynamo_limit", "dynamo_compile",
                          "dynamo_step"})
    priority = 80

    def install(self, ctx: Any) -> None:
        from torchdoctor.runner.frames import is_user_file

        self.ctx = ctx
        self.is_user = is_user_file
        self.counts: dict[str, int] = {}
        self.handler = _Handler(self)
        self.saved: dict[str, tuple[int, bool]] = {}  # logger name -> (level, propagate)
        self.last_record: Any = None
        self.time_entries: int | None = None
        self.loggers: list[tuple[str, str]] = []  # (artifact, logger name)
        self.scanned = False  # the registry read once dynamo is loaded
        self._arm()

    # ---- loggers --------------------------------------------------------------------------
    def _arm(self) -> None:
        if not self.scanned:
            self.scanned = ti.dynamo_loaded()
            self.loggers = [(a, q) for a in ("graph_breaks", "recompiles")
                            for q in ti.dynamo_artifact_loggers(a)]
        user_on = {a: ti.dynamo_artifact_enabled(a) for a in ("graph_breaks", "recompiles")}
        for artifact, q in self.loggers:
            lg = logging.getLogger(q)
            if q not in self.saved:
                self.saved[q] = (lg.level, lg.propagate)
            if self.handler not in lg.handlers:
                lg.addHandler(self.handler)
            if lg.level != logging.DEBUG:
                lg.setLevel(logging.DEBUG)
            if not user_on[artifact] and lg.propagate:
                lg.propagate = False  # the user did not ask to see these lines
        lim = logging.getLogger(ti.DYNAMO_LIMIT_LOGGER)
        if self.handler not in lim.handlers:
            lim.addHandler(self.handler)

    def _disarm(self) -> None:
        for q, (level, propagate) in self.saved.items():
            lg = logging.getLogger(q)
            if self.handler in lg.handlers:
                lg.removeHandler(self.handler)
            lg.setLevel(level)
            lg.propagate = propagate
        lim = logging.getLogger(ti.DYNAMO_LIMIT_LOGGER)
        if self.handler in lim.handlers:
            lim.removeHandler(self.handler)

    def _emit(self, kind: str, **fields: Any) -> None:
        n = self.counts.get(kind, 0)
        if n >= MAX_EVENTS:
            return
        self.counts[kind] = n + 1
        self.ctx.emit(kind, **fields)

    def on_record(self, record: logging.LogRecord) -> None:
        """A message from one of dynamo's loggers (the handler's emit)."""
        from torchdoctor.compilecheck import text

        if not self.ctx.in_owner_process():
            return
        msg = record.getMessage()
        step = self.ctx.step + 1  # the step in progress
        name = record.name
        if name.endswith(".__graph_breaks"):
            self._emit("dynamo_break", step=step, **text.parse_graph_break(msg, self.is_user))
        elif name.endswith(".__recompiles"):
            self._emit("dynamo_recompile", step=step, **text.parse_recompile(msg, self.is_user))
        elif record.levelno >= logging.WARNING:
            lim = text.parse_limit(msg, self.is_user)
            if lim is not None:
                self._emit("dynamo_limit", step=step, **lim)

    # ---- compile records ------------------------------------------------------------------
    def _new_records(self) -> list[Any]:
        recs = ti.dynamo_compilation_records()
        if not recs:
            return []
        new = recs
        if self.last_record is not None:
            for i in range(len(recs) - 1, -1, -1):
                if recs[i] is self.last_record:
                    new = recs[i + 1:]
                    break
        self.last_record = recs[-1]
        return new

    def _collect(self, step: int) -> None:
        if not ti.dynamo_loaded():
            return
        seconds = 0.0
        new = self._new_records()
        for r in new:
            rec = compile_record(r, self.is_user)
            seconds += rec.get("seconds") or 0.0
            self._emit("dynamo_compile", step=step, **rec)
        entries = ti.dynamo_compile_time_entries()
        grew = entries is not None and entries != (self.time_entries or 0)
        self.time_entries = entries
        if new or grew:
            self._emit("dynamo_step", step=step, records=len(new), compile_s=round(seconds, 6))

    def on_step_end(self, ctx: Any, step: int) -> None:
        self._collect(step)
        if not self.scanned and ti.dynamo_loaded():
            self._arm()  # dynamo's registry names, once
        elif self.loggers and logging.getLogger(self.loggers[0][1]).level != logging.DEBUG:
            self._arm()  # a set_logs in the script reset the levels

    def uninstall(self, ctx: Any) -> None:
        if not hasattr(self, "handler"):
            return
        try:
            self._collect(ctx.step + 1)  # compiles after the last step (an evaluation, say)
        finally:
            self._disarm()


class _Handler(logging.Handler):
    """Hands dynamo's records to the instrument; never raises, never prints."""

    def __init__(self, owner: DynamoDiag):
        super().__init__(level=logging.DEBUG)
        self.owner = owner

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.owner.on_record(record)
        except Exception:  # noqa: BLE001 - a message we cannot read costs its event only
            pass

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass


def compile_record(r: Any, is_user: Any = None) -> dict[str, Any]:
    """The fields of one of dynamo's compile records (absent fields: None); the recompile
    reason's failed guard and the user line it names (torch >= 2.8 adds a user stack)."""
    from torchdoctor.compilecheck import text

    g = lambda name: getattr(r, name, None)  # noqa: E731
    secs = g("entire_frame_compile_time_s")
    if secs is None and g("backward_cumulative_compile_time_us") is not None:
        secs = g("backward_cumulative_compile_time_us") / 1e6
    if secs is None and g("duration_us") is not None:
        secs = g("duration_us") / 1e6
    fail = g("fail_reason")
    first = str(fail).strip().splitlines()[0][:300] if fail else None
    gb, url = text.gb_of(str(fail) if fail else None)
    cid = g("compile_id")
    why = g("recompile_reason")
    frames = text.user_frames(str(why), is_user) if why else []
    return {"id": str(cid) if cid is not None else None, "function": g("co_name"),
            "file": g("co_filename"), "line": g("co_firstlineno"),
            "seconds": round(float(secs), 6) if isinstance(secs, (int, float)) else None,
            "forward": g("is_forward"), "fail": g("fail_type"), "fail_reason": first,
            "fail_gb": gb, "fail_url": url,
            "fail_file": g("fail_user_frame_filename"), "fail_line": g("fail_user_frame_lineno"),
            "guarded": g("has_guarded_code"), "recompile_guard": text.first_guard(why),
            "recompile_file": frames[0][0] if frames else None,
            "recompile_line": frames[0][1] if frames else None,
            "ops": g("graph_op_count")}
