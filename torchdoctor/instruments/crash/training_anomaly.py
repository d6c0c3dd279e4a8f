"""Anomaly mode for the ``inplace-modified`` follow-up run: name the forward op and line.

Armed in every run (probe ``run``) but idle unless the option ``anomaly_from_step`` is set,
which only the follow-up of an ``inplace-modified`` crash does. Anomaly mode costs about
2.5x and records a forward traceback for every autograd node, so it is switched on only
right before the failing step: at the end of step ``anomaly_from_step`` (0: from the start).
When backward fails, autograd warns "Error detected in <Node>. Traceback of forward call
that caused the error: ..."; that warning is captured (the script's own warning filters
notwithstanding) and its last user frame becomes evidence.

Events: ``anomaly`` {enabled_at_step}; ``anomaly_trace`` {node, op, forward_trace, where,
code, custom_function}; and a ``crash_context`` from ``on_crash`` for the crash rule.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from torchdoctor.instruments.base import Instrument, register

_HEAD = re.compile(r"Error detected in (\w+)\. Traceback of forward call that caused the error:")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def parse_anomaly(text: str) -> dict[str, Any] | None:
    """The node name and forward frames of an anomaly-mode warning (None if not one)."""
    m = _HEAD.search(text)
    if not m:
        return None
    node = m.group(1)
    frames = [{"file": f, "line": int(ln), "function": fn, "code": code.strip()}
              for f, ln, fn, code in _FRAME.findall(text[m.end():])]
    op = node[:-len("Backward0")] if node.endswith("Backward0") else re.sub(r"Backward\d*$", "", node)
    return {"node": node, "op": op, "forward_trace": frames}


@register
class AnomalyRerun(Instrument):
    name = "training_anomaly"
    produces = frozenset({"anomaly", "anomaly_trace"})
    priority = 90

    def install(self, ctx: Any) -> None:
        self.active = ctx.options.get("anomaly_from_step") is not None
        self.trace: dict[str, Any] | None = None
        self.enabled = False
        if not self.active:
            return
        import torch

        self.torch = torch
        self.ctx = ctx
        self.from_step = int(ctx.options.get("anomaly_from_step") or 0)
        from torchdoctor.runner.patching import Patches

        self._patches = Patches()  # undone only where our wrapper is still on top
        inst = self

        def make(orig_show):
            def showwarning(message, category, filename, lineno, file=None, line=None):
                if inst.active:  # inert after teardown (someone may have wrapped it since)
                    try:
                        inst._capture(str(message))
                    except Exception:  # noqa: BLE001
                        pass
                return orig_show(message, category, filename, lineno, file, line)
            return showwarning

        self._patches.wrap(warnings, "showwarning", make)
        self._filters = list(warnings.filters)
        warnings.filterwarnings("always", message=r"Error detected in ")
        if self.from_step <= 0:
            self._enable(0)

    def _enable(self, step: int) -> None:
        self.torch.autograd.set_detect_anomaly(True)
        self.enabled = True
        self.ctx.emit("anomaly", enabled_at_step=step)

    def on_step_end(self, ctx: Any, step: int) -> None:
        if self.active and not self.enabled and step >= self.from_step:
            self._enable(step)

    def _capture(self, text: str) -> None:
        if self.trace is not None:
            return
        rec = parse_anomaly(text)
        if rec is None:
            return
        from torchdoctor.numerics.names import _short
        from torchdoctor.runner.frames import is_user_file

        user = [dict(f, file=_short(f["file"])) for f in rec["forward_trace"]
                if is_user_file(f["file"])]
        last = (user or rec["forward_trace"] or [None])[-1]
        if last:
            rec["where"] = f"{last['file']}:{last['line']} in {last['function']}"
            rec["code"] = last["code"]
        rec["forward_trace"] = user or rec["forward_trace"][-3:]
        # built-in nodes are named <Op>Backward<N>; a custom autograd.Function's is <Name>Backward
        rec["custom_function"] = re.search(r"Backward\d+$", rec["node"]) is None
        self.trace = rec
        self.ctx.emit("anomaly_trace", **rec)

    def on_crash(self, ctx: Any, exc: BaseException) -> None:
        if not self.active or self.trace is None:
            return
        t = self.trace
        ctx.emit("crash_context", source=self.name,
                 evidence={"forward_op": t["op"], "forward_node": t["node"],
                           "forward_line": t.get("where"), "forward_code": t.get("code")},
                 fixes=[f"The tensor saved by {t['op']} at {t.get('where')} is modified in place "
                        "afterwards: use the out-of-place form of that later op, or .clone() "
                        "the tensor before modifying it"])

    def uninstall(self, ctx: Any) -> None:
        if not self.active:
            return
        self.active = False
        self._patches.undo()
        warnings.filters[:] = self._filters
        if self.enabled:
            self.torch.autograd.set_detect_anomaly(False)
