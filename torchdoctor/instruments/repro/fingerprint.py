"""Fingerprint: what one step saw and made, cheaply, so that two runs can be compared step by step.

Armed by ``repro`` (its trials' need ``fingerprint``). Per step (optimizer step boundary), in
the order one step's values depend on each other:

* ``batch``: every tensor of every batch the DataLoader iterators returned during the step (the
  iterators' common ``__next__`` wrapped; its result is only read);
* ``init``: the parameters before the first optimizer step (step 1 only: initialisation);
* ``forward``: the outputs of the root modules' calls, ``model`` then ``model#1`` … for more
  calls in one step (global forward hooks: nothing is put on
  the user's modules; module calls inside ``Dataset.__getitem__`` and in backward are skipped);
* ``grad``: the gradients the optimizer is about to apply (global optimizer step pre-hook, so a
  ``zero_grad`` after ``step`` does not hide them), named ``model.layer.weight``;
* ``update``: the parameters after the step.

Each tensor is reduced to ``[sum, sum of squares, strided sum]`` in float64 on its device
(:mod:`.fingerprint_reduce`): read-only on a detached tensor, no random draw, no setting
changed, no device sync. A step's reductions are stacked per kind and device at the step
boundary; everything is read once, at the end (``MAX_STEPS`` steps, ``MAX_PER_KIND`` tensors of a
kind per step at most). Idle in the localising re-run (option ``repro_ops``), whose dispatch mode
must see the user's ops only.

Event per step: ``fingerprint`` {step, kinds: {kind: [[label, sum, sumsq, strided], ...]}}
(a non-finite value as the string "nan"/"inf"/"-inf"); ``fingerprint_info`` {steps, tensors,
truncated, skipped_layouts?: {kind: n} (sparse, nested, meta... tensors: not read)} at the end.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.memory.layouts import unsupported

MAX_STEPS = 2000
MAX_PER_KIND = 4096
KINDS = ("batch", "init", "forward", "grad", "update")
_get_ident = threading.get_ident


def num(x: float) -> Any:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


@register
class Fingerprint(Instrument):
    name = "fingerprint"
    produces = frozenset({"fingerprint", "fingerprint_info"})
    priority = 86

    def install(self, ctx: Any) -> None:
        self.active = not ctx.options.get("repro_ops")
        if not self.active:
            return
        import torch
        from torch.nn.modules import module as mod_mod
        from torch.optim import optimizer as optim_mod

        from torchdoctor.instruments.repro.fingerprint_reduce import leaves, reduce3
        from torchdoctor.runner.patching import Patches
        from torchdoctor.torch_internals import base_loader_iter

        self.torch, self.ctx = torch, ctx
        self._reduce3, self._leaves = reduce3, leaves
        self.skipped: dict[str, int] = {}  # tensors of layouts not read, by kind
        self.rows: dict[str, list[tuple[str, Any]]] = {k: [] for k in KINDS}
        self.kept: list[tuple[int, str, list[str], list[tuple[list[int], Any]]]] = []
        self.truncated = False
        self.init_done = False
        self.fdepth = 0
        self.batch_n = 0
        self.calls: dict[int, int] = {}  # root id -> calls this step
        self.root_names: dict[int, str] = {}
        self.param_names: dict[int, str] = {}
        self.models_seen = -1
        self.pid = os.getpid()
        self.handles = [mod_mod.register_module_forward_pre_hook(self._fwd_pre),
                        mod_mod.register_module_forward_hook(self._fwd_post, always_call=True),
                        optim_mod.register_optimizer_step_pre_hook(self._opt_pre)]
        self._patches = Patches()
        inst = self

        def make_next(orig):
            def next_with_fingerprint(it):
                batch = orig(it)
                if inst.active and inst.ctx.in_owner_thread():
                    try:
                        inst._batch(batch)
                    except Exception:  # noqa: BLE001 - measurement never breaks the loop
                        inst.hook_failed(inst.ctx, "batch")
                        inst.active = False
                return batch
            return next_with_fingerprint

        self._patches.wrap(base_loader_iter(), "__next__", make_next, tag="fingerprint")

    # ------------------------------------------------------------------ recording
    def _add(self, kind: str, label: str, t: Any) -> None:
        rows = self.rows[kind]
        if len(rows) >= MAX_PER_KIND:
            self.truncated = True
            return
        r = self._reduce3(self.torch, t)
        if r is None:  # a sparse, nested, meta... tensor: not read, counted
            kind_ = unsupported(t) or "unreadable"
            self.skipped[kind_] = self.skipped.get(kind_, 0) + 1
            return
        rows.append((label, r))

    def _batch(self, batch: Any) -> None:
        if len(self.kept) >= MAX_STEPS * len(KINDS):
            return
        n = self.batch_n
        self.batch_n += 1
        for label, t in self._leaves(self.torch, batch):
            self._add("batch", f"batch{n}{label}", t)

    def _names(self) -> None:
        ctx = self.ctx
        if ctx.models_seen == self.models_seen:
            return
        self.models_seen = ctx.models_seen
        from torchdoctor.numerics.names import Namer

        roots = [m for m in ctx.models() if next(m.parameters(), None) is not None]
        namer = Namer(roots)
        self.param_names = dict(namer.params)

    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not self.active or not self.ctx.in_owner_thread():
            return None
        self.fdepth += 1
        return None

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        if not self.active or not self.ctx.in_owner_thread() or self.fdepth <= 0:
            return None
        self.fdepth -= 1
        if self.fdepth or self.ctx.phase in ("data", "backward"):
            return None
        try:
            key = id(module)
            name = self.root_names.get(key)
            if name is None:
                from torchdoctor.numerics.names import root_label

                name = self.root_names[key] = root_label(module)
            n = self.calls.get(key, 0)
            self.calls[key] = n + 1
            for label, t in self._leaves(self.torch, output):
                self._add("forward", f"{name}{f'#{n}' if n else ''}{label}", t)
        except Exception:  # noqa: BLE001
            self.hook_failed(self.ctx, "forward")
            self.active = False
        return None

    def _opt_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not self.active or not self.ctx.in_owner_thread():
            return
        try:
            self._names()
            if not self.init_done:
                self.init_done = True
                self._params("init")
            k = 0
            for g in opt.param_groups:
                for p in g.get("params", ()):
                    if getattr(p, "grad", None) is not None:
                        self._add("grad", self.param_names.get(id(p), f"param#{k}"), p.grad)
                    k += 1
        except Exception:  # noqa: BLE001
            self.hook_failed(self.ctx, "optimizer_pre")
            self.active = False

    def _params(self, kind: str) -> None:
        seen: set[int] = set()
        for m in self.ctx.models():
            for p in m.parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                self._add(kind, self.param_names.get(id(p), f"param#{len(seen)}"), p)

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.active:
            return
        self._names()
        if self.rows["grad"] or self.rows["batch"] or self.rows["forward"]:
            self._params("update")
        if len(self.kept) < MAX_STEPS * len(KINDS):
            torch = self.torch
            for kind in KINDS:
                rows = self.rows[kind]
                if not rows:
                    continue
                by_dev: dict[Any, list[int]] = {}
                for i, (_l, t) in enumerate(rows):
                    by_dev.setdefault(t.device, []).append(i)
                stacks = [(idx, torch.stack([rows[i][1] for i in idx])) for idx in by_dev.values()]
                self.kept.append((step, kind, [lab for lab, _ in rows], stacks))
        else:
            self.truncated = True
        self.rows = {k: [] for k in KINDS}
        self.calls.clear()
        self.batch_n = 0

    # ------------------------------------------------------------------ teardown
    def uninstall(self, ctx: Any) -> None:
        if not getattr(self, "active", False) and not hasattr(self, "kept"):
            return
        for h in getattr(self, "handles", []):
            h.remove()
        self.handles = []
        if getattr(self, "_patches", None) is not None:
            self._patches.undo()
        self.active = False
        torch = self.torch
        # one read per device: every kept stack of that device concatenated
        by_dev: dict[Any, list[Any]] = {}
        for _s, _k, _l, stacks in self.kept:
            for _idx, st in stacks:
                by_dev.setdefault(st.device, []).append(st)
        values: dict[int, list] = {}
        for dev, sts in by_dev.items():
            flat = torch.cat(sts).tolist()
            pos = 0
            for st in sts:
                values[id(st)] = flat[pos:pos + st.shape[0]]
                pos += st.shape[0]
        per_step: dict[int, dict[str, list]] = {}
        tensors = 0
        for step, kind, labels, stacks in self.kept:
            rows: list = [None] * len(labels)
            for idx, st in stacks:
                for i, v in zip(idx, values[id(st)]):
                    rows[i] = [labels[i], *(num(x) for x in v)]
            tensors += len(rows)
            per_step.setdefault(step, {})[kind] = rows
        for step in sorted(per_step):
            ctx.emit("fingerprint", step=step, kinds=per_step[step])
        ctx.emit("fingerprint_info", steps=len(per_step), tensors=tensors, truncated=self.truncated,
                 **({"skipped_layouts": self.skipped} if self.skipped else {}))
        self.kept = []
