"""The child side of ``repro --resume-check``: a restart from the script's own checkpoint, simulated.

Armed through the save audit when the trial's options carry ``resume_trace`` (record the LR of
every step) or ``resume_reset`` ({site, n, reset}: at the ``n``-th save of ``site``, just after
the save was written, reset the listed states). A resumed process restores what its checkpoint
holds and starts everything else afresh; in the same process that is: keep what the save holds
(restoring it would give it back as it is) and put each state the save lacks back to the value a
fresh process would have — then let the script go on. The data position carries on unchanged
(as if the loader's position had been restored), so a difference in the losses is the missing
state's doing. The fresh values, taken once, small:

* an optimizer's: its ``state_dict()`` at its first step (before any state exists; param groups
  as the constructor and the schedulers left them) — ``optimizer:<i>``;
* an LR scheduler's / a GradScaler's: its ``state_dict()`` right after its constructor —
  ``scheduler:<i>`` / ``scaler:<i>`` (``<i>`` in the order of the ``save`` event's ``live``);
* the global generators' (``rng:torch``, ``rng:cuda``, ``rng:numpy``, ``rng:python``): their states
  at the first optimizer step, i.e. after the script's start-up (seeding, model construction).

Events: ``resume_reset`` {where, n, step, reset (done), failed, lr_before, lr_after};
``lr_trace`` {steps, lrs[, scales]} at the end: the LR of each live optimizer's first param group
at each step (the LR that step used), and the loss scale of each enabled GradScaler (the traced
loss is the scaled one). Cost: one dict lookup per optimizer step, the LR reads at each step end
(and one CUDA read of the scale per step with an enabled GradScaler), and the fresh copies above.
"""

from __future__ import annotations

import copy
import random
import sys
from typing import Any

MAX_STEPS = 100_000


class ResumeReset:
    def __init__(self, ctx: Any, live: Any, cfg: dict) -> None:
        self.ctx = ctx
        self.live = live
        self.site = cfg.get("site")
        self.n = int(cfg.get("n") or 1)
        self.keys = [str(k) for k in cfg.get("reset") or []]
        self.fresh: dict[int, Any] = {}  # id(object) -> state_dict when fresh
        self.rng: dict[str, Any] | None = None
        self.done = False
        self.trace: list[tuple[int, list]] = []
        self.handles: list[Any] = []

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.live.on_built = self._built
        self.handles.append(register_optimizer_step_pre_hook(self._pre))

    # ---- fresh states ----------------------------------------------------------------------
    def _built(self, kind: str, obj: Any) -> None:
        try:
            self.fresh[id(obj)] = copy.deepcopy(obj.state_dict())
        except Exception:  # noqa: BLE001 - this state cannot be reset: said at the reset
            pass

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if id(opt) in self.fresh or not self.ctx.in_owner_process():
            return None
        try:
            self.fresh[id(opt)] = copy.deepcopy(opt.state_dict())
            if self.rng is None:
                self.rng = _rng_states()
        except Exception:  # noqa: BLE001
            self.fresh.setdefault(id(opt), None)
        return None

    # ---- the trace -------------------------------------------------------------------------
    def _lrs(self) -> list:
        out = []
        for o in self.live.optimizers(self.ctx):
            v = o.param_groups[0].get("lr") if o.param_groups else None
            out.append(v if isinstance(v, (int, float)) else None)
        return out

    def _scales(self) -> list:
        """The loss scale of each enabled GradScaler: the traced loss is the scaled one
        (``scaler.scale(loss).backward()``). ``get_scale()`` reads a CUDA scalar: one sync per
        step, in the resume check's runs only (they are compared on values, not timed)."""
        return [float(s.get_scale()) for s in self.live.scalers() if s.is_enabled()]

    def on_step_end(self, step: int) -> None:
        if len(self.trace) < MAX_STEPS:
            self.trace.append((step, self._lrs(), self._scales()))

    # ---- the restart -----------------------------------------------------------------------
    def after_save(self, where: str, n: int) -> None:
        if self.done or not self.keys or where != self.site or n != self.n:
            return
        self.done = True
        before = self._lrs()
        done, failed = [], []
        for key in self.keys:
            try:
                (done if self._reset(key) else failed).append(key)
            except Exception as e:  # noqa: BLE001 - reported, the script goes on
                failed.append(f"{key}: {type(e).__name__}: {str(e)[:200]}")
        self.ctx.emit("resume_reset", where=where, n=n, step=self.ctx.step, reset=done, failed=failed,
                      lr_before=before, lr_after=self._lrs())

    def _reset(self, key: str) -> bool:
        kind, _, idx = key.partition(":")
        if kind == "rng":
            return _set_rng(idx, (self.rng or {}).get(idx))
        objs = {"optimizer": self.live.optimizers(self.ctx), "scheduler": self.live.schedulers(),
                "scaler": self.live.scalers()}.get(kind)
        if objs is None or not idx.isdigit() or int(idx) >= len(objs):
            return False
        obj = objs[int(idx)]
        fresh = self.fresh.get(id(obj))
        if fresh is None:
            return False
        obj.load_state_dict(copy.deepcopy(fresh))
        return True

    def uninstall(self) -> None:
        self.live.on_built = None
        for h in self.handles:
            h.remove()
        self.handles = []
        out = {"steps": [t[0] for t in self.trace], "lrs": [t[1] for t in self.trace]}
        if any(t[2] for t in self.trace):
            out["scales"] = [t[2] for t in self.trace]
        self.ctx.emit("lr_trace", **out)


def _rng_states() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _set_rng(kind: str, state: Any) -> bool:
    import torch

    if state is None:
        return False
    if kind == "torch":
        torch.set_rng_state(state)
    elif kind == "cuda":
        torch.cuda.set_rng_state_all(state)
    elif kind == "numpy":
        sys.modules["numpy"].random.set_state(state)
    elif kind == "python":
        random.setstate(state)
    else:
        return False
    return True
