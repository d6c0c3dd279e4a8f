"""Treatment: applies ``treat``'s treatments inside the child, and surveys what the script built.

Armed only by ``torchdoctor treat`` (its runs' variations need ``treatment``). Reads
``ctx.options["treatment"]``: a list of ``{"name", "value"}`` (empty or absent: the baseline,
survey only). Each name is applied by its family module in ``torchdoctor/treat/`` (an
:class:`~torchdoctor.treat.child.Applier`: patches through ``Patches``, flags restored,
objects treated at first use); all of it is undone on uninstall. The survey
(:mod:`torchdoctor.treat.survey`) runs in every treat run, baseline and treated alike.

Events (at uninstall): ``treat_survey`` (see the survey module) and ``treatment``
{applied: [{name, value, changes: [{what, where, code, count?}], notes}], compile_steps,
compile_s} — ``changes`` are the user's lines the treatment changed and the code to write
there; ``compile_steps`` the steps during which torch.compile compiled (``compile`` only).
An applier that fails to install is reported as ``treatment_error`` {name, error} and the run
goes on untreated by it (the trial is then ``failed`` with that error).
"""

from __future__ import annotations

import traceback
from typing import Any

from torchdoctor.instruments.base import Instrument, register


@register
class Treatment(Instrument):
    name = "treatment"
    produces = frozenset({"treatment", "treat_survey", "treatment_error"})
    priority = 5  # before the data source's and training instruments' constructor wrappers

    def install(self, ctx: Any) -> None:
        from torchdoctor.treat.child import RootWatch, applier_class
        from torchdoctor.treat.survey import Survey

        self.survey = Survey()
        self.survey.install(ctx)
        self.appliers: list[Any] = []
        self.watch = None
        for spec in ctx.options.get("treatment") or []:
            name = str(spec.get("name"))
            try:
                a = applier_class(name)(spec.get("value"))
                a.install(ctx)
                self.appliers.append(a)
            except Exception as e:  # noqa: BLE001 - the trial fails with this error, the run goes on
                ctx.emit("treatment_error", name=name, error=f"{type(e).__name__}: {e}"[:500],
                         traceback=traceback.format_exc(limit=6))
        self.together = frozenset(a.name for a in self.appliers)
        if self.together & {"compile", "compile-blocks"}:
            self.survey.watch_steps = 1
        if self._roots_wanted(0):
            self.watch = RootWatch(ctx, self._on_root)

    def _roots_wanted(self, step: int) -> bool:
        return any(a.active() and a.wants_roots(step, self.together) for a in self.appliers)

    def _failed(self, a: Any, where: str, e: BaseException) -> None:
        """An applier raised: reported (the trial is ``failed``), switched off; the script goes on."""
        a.live = False
        self.survey.ctx.emit("treatment_error", name=a.name, error=f"{type(e).__name__}: {e}"[:500],
                             where=where, traceback=traceback.format_exc(limit=6))

    def _each(self, callback: str, *args: Any) -> None:
        for a in self.appliers:
            if a.live:
                try:
                    getattr(a, callback)(*args)
                except Exception as e:  # noqa: BLE001
                    self._failed(a, callback, e)

    def _on_root(self, module: Any, args: tuple) -> tuple | None:
        changed = None
        for a in self.appliers:
            try:
                if a.active() and a.wants_roots(self.survey.ctx.step, self.together):
                    new = a.on_root(self.survey.ctx, module, changed or args)
                    if new is not None:
                        changed = new
            except Exception as e:  # noqa: BLE001 - never into the user's forward
                self._failed(a, "forward", e)
        return changed

    def on_batch(self, ctx: Any, wait_s: float) -> None:
        self.survey.on_batch(ctx)

    def on_backward_begin(self, ctx: Any) -> None:
        self._each("on_backward_begin", ctx)

    def on_backward_end(self, ctx: Any) -> None:
        self._each("on_backward_end", ctx)

    def on_step_end(self, ctx: Any, step: int) -> None:
        self.survey.on_step_end(ctx, step)
        self._each("on_step_end", ctx, step)
        if self.watch is not None and not self._roots_wanted(step):
            self.watch.stop()
            self.watch = None

    def uninstall(self, ctx: Any) -> None:
        if self.watch is not None:
            self.watch.stop()
        applied, extra = [], {}
        for a in reversed(self.appliers):
            try:
                a.uninstall(ctx)
            finally:
                applied.insert(0, a.record())
                extra.update(getattr(a, "extra", None) or {})
        self.survey.uninstall(ctx)
        ctx.emit("treat_survey", **self.survey.record())
        ctx.emit("treatment", applied=applied, **extra)
