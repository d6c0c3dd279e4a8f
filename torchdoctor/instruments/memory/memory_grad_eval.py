"""Forward passes that build an autograd graph nobody backpropagates (``grad-in-eval``).

After the step clock has discovered the root models (``ctx.models()``, those with
parameters), a forward hook on each root looks at its output: when grad mode is on and an
output tensor has a ``grad_fn``, that forward *built a graph*. A backward pre-hook on the
output's ``grad_fn`` marks it backpropagated when it runs; autograd holds that hook as long
as the node lives, so the hook object's ``__del__`` tells when the graph was freed. A
graph-building forward whose graphs were all freed (or are still alive at the end) without
their ``grad_fn`` ever running is counted as *never backpropagated*, with the model's class,
train/eval mode, step and the user line that called it. (The output tensor's own lifetime
is no proxy: ``loss = f(model(x))`` drops it at once while the graph lives on.)

The exact tracking (a backward pre-hook and the user's line per forward, 20–40 µs a forward
on the CPU box) starts only when it is needed. Until then a graph-building forward just
sets a flag that the next backward clears; a graph-building forward that finds the flag
still set (the previous one saw no backward before it: an evaluation loop with grad on,
two forwards per backward) switches to exact tracking for the rest of the run, from that
forward on. The forward before it is counted as ``unchecked``. Forwards of the cheap phase
that a backward followed count as backpropagated.

Cost: one hook call per root forward (a few microseconds); nothing per module or per op.
Evaluation loops run under ``torch.no_grad()``/``inference_mode()`` produce no ``grad_fn``
and cost nothing but the check.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.memory.frames import user_frames_from_frame
from torchdoctor.runner.userhooks import hookable, register_on

MAX_EXAMPLES = 5
MAX_OUTPUTS = 4  # output tensors looked at per forward (tuple/dict outputs)


class _Mark:
    """Backward pre-hook on an output's ``grad_fn``. Autograd keeps it as long as the node
    lives, so its ``__del__`` says when the graph was freed - backpropagated or not."""

    __slots__ = ("owner", "rec")

    def __init__(self, owner: "GradInEval", rec: "_Fwd"):
        self.owner = owner
        self.rec = rec

    def __call__(self, grad_outputs: Any) -> None:
        self.owner._ran(self.rec)
        return None

    def __del__(self) -> None:
        try:
            self.owner._gone(self.rec)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Fwd:
    __slots__ = ("alive", "ran", "step", "module", "training", "site")

    def __init__(self, alive: int, step: int, module: str, training: bool, site: str | None):
        self.alive = alive
        self.ran = False
        self.step = step
        self.module = module
        self.training = training
        self.site = site


def _tensors(out: Any, tensor_type: type) -> list[Any]:
    """Up to MAX_OUTPUTS output tensors that have a grad_fn (tuples, lists, dicts: 2 levels).
    Iterative, no closures: nothing here may form a reference cycle holding the outputs."""
    found: list[Any] = []
    todo = [(out, 0)]
    while todo and len(found) < MAX_OUTPUTS:
        o, depth = todo.pop()
        if isinstance(o, tensor_type):
            if o.grad_fn is not None:
                found.append(o)
        elif depth < 2 and isinstance(o, (tuple, list)):
            todo.extend((x, depth + 1) for x in o)
        elif depth < 2 and isinstance(o, dict):
            todo.extend((x, depth + 1) for x in o.values())
    return found


@register
class GradInEval(Instrument):
    name = "memory_grad_eval"
    produces = frozenset({"grad_eval"})
    priority = 70

    def install(self, ctx: Any) -> None:
        import torch

        self.torch = torch
        self._Tensor = torch.Tensor
        self._grad_on = torch.is_grad_enabled
        self.pid = os.getpid()
        self.ctx = ctx
        self.hooked: set[int] = set()
        self.roots_seen: int | None = None
        self.handles: list[Any] = []
        self.hooks: list[Any] = []
        self.unhookable: dict[int, type] = {}  # roots watched by the global hook instead
        self.global_handle: Any = None
        self.graph_forwards = 0
        self.backpropagated = 0
        self.dropped = 0
        self.exact_from: int | None = None  # step from which every forward is tracked
        self.awaiting_backward = False  # cheap phase: a graph forward has seen no backward yet
        self.unchecked = 0
        self.live: set[Any] = set()  # _Fwd records whose outputs are alive and not yet run
        self.examples: list[dict[str, Any]] = []

    def _hook_roots(self, ctx: Any) -> None:
        seen = ctx.models_seen
        if seen == self.roots_seen or self._hook_failed:
            return
        self.roots_seen = seen
        for m in ctx.models():
            if id(m) in self.hooked:
                continue
            self.hooked.add(id(m))
            if not any(True for _ in m.parameters()):
                continue  # a loss module: its graph is the model's
            try:
                if hookable(m):  # a UserHook: a deepcopy or pickle of the model leaves it out
                    handle, hook = register_on(m, "forward", self._post)
                    self.hooks.append(hook)
                else:  # its class copies its hook dicts as they are: nothing on it
                    self.unhookable[id(m)] = type(m)
                    if self.global_handle is not None:
                        continue
                    from torch.nn.modules import module as mod_mod

                    handle = self.global_handle = mod_mod.register_module_forward_hook(self._g_post)
            except Exception:  # noqa: BLE001
                continue
            self.handles.append(handle)

    def on_step_end(self, ctx: Any, step: int) -> None:
        self._hook_roots(ctx)

    def on_batch(self, ctx: Any, wait_s: float) -> None:
        if ctx.step >= 1:
            self._hook_roots(ctx)

    # ---- per root forward ----------------------------------------------------------------
    def _g_post(self, module: Any, args: Any, output: Any) -> None:
        """The global stand-in for roots that cannot carry a hook (one dict look-up a call)."""
        if self.unhookable.get(id(module)) is type(module):
            return self._post(module, args, output)
        return None

    def _post(self, module: Any, args: Any, output: Any) -> None:
        try:
            if not self._grad_on() or not self.ctx.in_owner_thread():
                return
            if type(output) is self._Tensor:  # the common case, inlined
                if output.grad_fn is None:
                    return
                ts = [output]
            else:
                ts = _tensors(output, self._Tensor)
                if not ts:
                    return
            self.graph_forwards += 1
            if self.exact_from is None:
                if not self.awaiting_backward:
                    self.awaiting_backward = True  # cleared by the next backward
                    return
                self.exact_from = self.ctx.step + 1  # no backward since the last one: track
                self.unchecked += 1
                self.awaiting_backward = False
            frames = user_frames_from_frame(sys._getframe(1), limit=1)  # formatted only if reported
            rec = _Fwd(len(ts), self.ctx.step, type(module).__name__, bool(module.training),
                       frames[0] if frames else None)
            self.live.add(rec)
            for t in ts:
                try:
                    t.grad_fn.register_prehook(_Mark(self, rec))
                except Exception:  # noqa: BLE001
                    rec.alive -= 1
            if rec.alive <= 0:
                self.live.discard(rec)
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_post")
        return None

    def on_backward_begin(self, ctx: Any) -> None:
        if self.awaiting_backward:
            self.awaiting_backward = False
            self.backpropagated += 1

    def _ran(self, rec: _Fwd) -> None:
        if not rec.ran:
            rec.ran = True
            self.backpropagated += 1
            self.live.discard(rec)

    def _gone(self, rec: _Fwd) -> None:
        rec.alive -= 1
        if rec.alive <= 0 and not rec.ran:
            self.live.discard(rec)
            self.dropped += 1
            self._example(rec, "dropped")

    def _example(self, rec: _Fwd, how: str) -> None:
        """Group never-backpropagated forwards by (module, mode, call site, fate)."""
        from torchdoctor.memory.frames import loc

        mode = "train" if rec.training else "eval"
        site = loc(rec.site) if rec.site else None
        for e in self.examples:
            if (e["module"], e["mode"], e["site"], e["outputs"]) == (rec.module, mode, site, how):
                e["count"] += 1
                e["last_step"] = rec.step
                return
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"module": rec.module, "mode": mode, "site": site,
                                  "outputs": how, "count": 1, "first_step": rec.step,
                                  "last_step": rec.step})

    # ---- summary ---------------------------------------------------------------------------
    def _summary(self, ctx: Any) -> None:
        pending = [r for r in self.live if not r.ran]
        for r in pending:
            self._example(r, "kept alive")
        eval_mode = sum(e["count"] for e in self.examples if e["mode"] == "eval")
        ctx.emit("grad_eval", roots_hooked=len(self.hooks) + len(self.unhookable), graph_forwards=self.graph_forwards,
                 backpropagated=self.backpropagated, dropped=self.dropped,
                 kept_alive=len(pending), examples=self.examples, in_eval_mode=eval_mode,
                 exact_from_step=self.exact_from,
                 unchecked=self.unchecked + int(self.awaiting_backward))

    def on_crash(self, ctx: Any, exc: BaseException) -> None:
        self._summary(ctx)
        self.summarised = True

    def uninstall(self, ctx: Any) -> None:
        for k in self.hooks:
            k.detach()
        for h in self.handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        if not getattr(self, "summarised", False):
            self._summary(ctx)
