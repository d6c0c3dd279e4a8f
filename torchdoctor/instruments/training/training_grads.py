"""Gradient bookkeeping bugs: gradients never cleared, parameters that never get a gradient,
trainable parameters no optimizer updates, modules hidden from registration.

No device sync on the hot path: everything here reads Python-side metadata (``p.grad`` object
identity, its version counter, the optimizers' param groups) at moments the step clock gives.

**Gradients not cleared** (``missing-zero-grad``). After an optimizer consumed the gradients
(its post-step hook), each parameter's ``.grad`` object and ``_version`` are remembered. At
the next backward's start the gradient was cleared if it is ``None``, a different tensor, or
its version moved (``zero_()``, ``fill_(0)``); ``Optimizer.zero_grad`` / ``Module.zero_grad``
calls also clear the parameters they cover. A parameter still holding the consumed gradient
when a backward starts is *suspect*; if it is still suspect when its optimizer steps again, that
step used accumulated gradients. ``p.grad.data.zero_()`` bypasses the version counter, so the
suspects' gradients are also reduced to norms on the device at that backward's start (one fused
kernel, only when there are suspects) and read once at the end: a zero norm means cleared.
Deliberate accumulation (several backwards, then step, then clear) never leaves a suspect:
the clear happens before the next cycle's first backward.

**Parameter audit** at steps 1, 2, 10, 100, ... and at the end: parameters of *trained* roots
(root modules with at least one parameter in an optimizer that stepped) that require grad but
never had a gradient at an optimizer step (``unused``), that are in no optimizer
(``not_in_optimizer``), and modules held in plain list/tuple/dict attributes that no root
registers (``unregistered``): of the roots and of the outermost modules the script built that no
root holds (a model whose forward is never called: its layers trained through ``.forward``).

**Where** (``_sites.py``): the user's line that built each optimizer and each module, so a
finding names a line: ``optimizer_at`` / ``step_at`` (the line calling ``optimizer.step()``)
on ``zero_grad_stale``; ``created_at`` (the line that built the parameter's module) on each
``not_in_optimizer`` and ``unused`` entry.

Events: ``zero_grad_stale`` {step, optimizer, stale, with_grad, params, consumed_at,
norms_ref, optimizer_at, step_at} (a few), ``zero_grad_summary`` {judged_steps, stale_steps,
suspect_norms}, and ``params_audit`` {step, final, optimizers, trained_roots, unused,
not_in_optimizer, unregistered}.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.runner.patching import Patches
from torchdoctor.torch_internals import foreach_norm, local_tensor

MAX_NAMES = 12
MAX_STALE_EVENTS = 5
AUDIT_STEPS = {1, 2, 10, 100, 1000, 10000}
MAX_BUILT = 20000  # modules the script built, looked at for holders no root seen in forward holds


@register
class TrainingGrads(Instrument):
    name = "training_grads"
    produces = frozenset({"zero_grad_summary", "zero_grad_stale", "params_audit"})
    priority = 55

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim import optimizer as optim_mod

        self.torch = torch
        self.ctx = ctx
        self.pid = os.getpid()
        # id(p) -> [param, grad weakref, version, status ("consumed"|"stale"), consumed_at, norm]
        self.state: dict[int, list] = {}
        self.had_grad: set[int] = set()
        self.opt_steps: dict[int, int] = {}  # id(opt) -> pre-steps seen
        self.opt_index: dict[int, int] = {}
        self.judged = 0
        self.stale_steps = 0
        self.stale_events = 0
        self.first_stale: dict | None = None
        self.norm_checks: list[tuple[Any, list[int]]] = []  # (device norms, param ids)
        self.stale_norm_refs: list[tuple[int, int, int]] = []  # (check idx, pos, stale event idx)
        self.hidden_seen: dict[int, dict] = {}
        self.handles = [optim_mod.register_optimizer_step_pre_hook(self._pre_step),
                        optim_mod.register_optimizer_step_post_hook(self._post_step)]
        self._undo = Patches()  # undone only where our wrapper is still on top
        self._patch_zero_grad(torch)
        self._patch_constructors(torch)

    def _patch_constructors(self, torch) -> None:
        """Remember the user's line that built each optimizer and module (see ``_sites``)."""
        from torchdoctor.instruments._sites import SiteBook, creation_site

        self.opt_sites = SiteBook()
        self.module_sites = SiteBook()
        for cls, book in ((torch.optim.Optimizer, self.opt_sites), (torch.nn.Module, self.module_sites)):
            orig = cls.__init__
            init = _site_init(self, orig, book, creation_site)
            self._undo.set(cls, "__init__", init, orig)

    def _patch_zero_grad(self, torch) -> None:
        inst = self
        Opt = torch.optim.Optimizer
        Mod = torch.nn.Module
        orig_opt, orig_mod = Opt.zero_grad, Mod.zero_grad

        def opt_zero_grad(opt, *a, **k):
            try:
                return orig_opt(opt, *a, **k)
            finally:
                if inst.state and inst.ctx.in_owner_thread():
                    for g in opt.param_groups:
                        for p in g["params"]:
                            inst.state.pop(id(p), None)

        def mod_zero_grad(mod, *a, **k):
            try:
                return orig_mod(mod, *a, **k)
            finally:
                if inst.state and inst.ctx.in_owner_thread():
                    for p in mod.parameters():
                        inst.state.pop(id(p), None)

        self._undo.set(Opt, "zero_grad", opt_zero_grad, orig_opt)
        self._undo.set(Mod, "zero_grad", mod_zero_grad, orig_mod)

    live = True  # False once uninstalled (a wrapper another library re-wrapped stays inert)

    def uninstall(self, ctx: Any) -> None:
        self.live = False
        for h in self.handles:
            h.remove()
        self._undo.undo()
        self._audit(final=True)
        norms = self._read_norms()
        ctx.emit("zero_grad_summary", judged_steps=self.judged, stale_steps=self.stale_steps,
                 first=self.first_stale, suspect_norms=norms)

    # ------------------------------------------------------------------ hooks
    def _post_step(self, opt, args, kwargs):
        try:
            if not self.ctx.in_owner_thread():
                return None
            st = self.state
            for g in opt.param_groups:
                for p in g["params"]:
                    gr = p.grad
                    if gr is None:
                        continue
                    try:
                        st[id(p)] = [p, weakref.ref(gr), gr._version, "consumed", self.ctx.step, None]
                    except (TypeError, RuntimeError):
                        pass
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_post_step")
        return None

    def on_backward_begin(self, ctx: Any) -> None:
        st = self.state
        if not st:
            return
        suspects = []
        for pid_, s in list(st.items()):
            p = s[0]
            gr = p.grad
            if gr is None or gr is not s[1]():
                del st[pid_]
                continue
            try:
                ver = gr._version
            except RuntimeError:
                del st[pid_]
                continue
            if ver != s[2]:
                del st[pid_]  # zeroed (or otherwise rewritten) in place since
                continue
            s[3] = "stale"
            suspects.append(pid_)
        if suspects:
            torch = self.torch
            # a DTensor gradient (FSDP2, tensor parallel): its local shard, each rank judging its
            # own (a DTensor's norm is a pending sum: reading it later would be a collective)
            grads = [local_tensor(st[i][0].grad) for i in suspects]
            try:
                with torch.no_grad():
                    ns = foreach_norm()(grads, 2, dtype=torch.float32)
                    dev = ns[0].device
                    norms = torch.stack([n if n.device == dev else n.to(dev) for n in ns])
                k = len(self.norm_checks)
                self.norm_checks.append((norms, suspects))
                for pos, i in enumerate(suspects):
                    st[i][5] = (k, pos)
            except Exception:  # noqa: BLE001 - sparse grads etc.: judge on versions alone
                pass

    def on_backward_end(self, ctx: Any) -> None:
        for s in self.state.values():
            if s[3] == "stale":
                gr = s[0].grad
                if gr is not None:
                    s[1] = weakref.ref(gr)
                    try:
                        s[2] = gr._version
                    except RuntimeError:
                        pass

    def _pre_step(self, opt, args, kwargs):
        try:
            if not self.ctx.in_owner_thread():
                return None
            oid = self.opt_index.setdefault(id(opt), len(self.opt_index))
            self.opt_steps[id(opt)] = self.opt_steps.get(id(opt), 0) + 1
            st = self.state
            stale, with_grad = [], 0
            for g in opt.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        continue
                    with_grad += 1
                    self.had_grad.add(id(p))
                    s = st.get(id(p))
                    if s is not None and s[3] == "stale" and p.grad is s[1]():
                        stale.append(s)
            if self.opt_steps[id(opt)] > 1:
                self.judged += 1
            if stale:
                self.stale_steps += 1
                if self.stale_events < MAX_STALE_EVENTS:
                    self.stale_events += 1
                    self._emit_stale(opt, oid, stale, with_grad)
            return None
        except Exception:  # noqa: BLE001 - never raise into the user's code
            self.hook_failed(self.ctx, "_pre_step")
        return None

    def _emit_stale(self, opt: Any, oid: int, stale: list, with_grad: int) -> None:
        from torchdoctor.numerics.names import Namer

        namer = Namer(self.ctx.models())
        from torchdoctor.instruments._sites import call_site

        refs = [s[5] for s in stale if s[5] is not None]
        ev = {"step": self.ctx.step + 1, "optimizer": oid, "stale": len(stale),
              "with_grad": with_grad, "consumed_at": stale[0][4],
              "params": [namer.param(s[0]) for s in stale[:MAX_NAMES]],
              "norms_ref": refs, "optimizer_at": self.opt_sites.get(opt), "step_at": call_site(3)}
        if self.first_stale is None:
            self.first_stale = {k: ev[k] for k in ("step", "optimizer", "stale", "with_grad",
                                                   "consumed_at", "params")}
        self.ctx.emit("zero_grad_stale", **ev)

    def _read_norms(self) -> list[list[float]]:
        """The suspects' gradient norms at backward start, read once (one sync) at the end."""
        if not self.norm_checks:
            return []
        try:
            torch = self.torch
            flat = torch.cat([n.to(self.norm_checks[0][0].device) for n, _ in self.norm_checks])
            vals = flat.tolist()
        except Exception:  # noqa: BLE001
            return []
        out, pos = [], 0
        for n, _ids in self.norm_checks:
            k = n.numel()
            out.append(vals[pos:pos + k])
            pos += k
        return out

    def on_step_end(self, ctx: Any, step: int) -> None:
        if step in AUDIT_STEPS:
            self._audit(final=False)

    # ------------------------------------------------------------------ parameter audit
    def _audit(self, final: bool) -> None:
        from torchdoctor.numerics.names import Namer

        ctx = self.ctx
        opts = ctx.optimizers
        if not opts:
            return
        opt_params: set[int] = set()
        for o in opts:
            for g in o.param_groups:
                for p in g["params"]:
                    opt_params.add(id(p))
        roots = [m for m in ctx.models()]
        namer = Namer(roots)
        trained = [m for m in roots if any(id(p) in opt_params for p in m.parameters())]
        unused, not_in_opt = [], []
        seen: set[int] = set()
        for root in trained:
            for mname, mod in root.named_modules():
                for pn, p in mod.named_parameters(recurse=False):
                    if id(p) in seen or not p.requires_grad:
                        continue
                    seen.add(id(p))
                    pname = namer.param(p, f"{mname}.{pn}" if mname else pn)
                    if id(p) not in opt_params:
                        item = {"name": pname, "numel": p.numel(), "has_grad": p.grad is not None}
                    elif id(p) not in self.had_grad:
                        item = {"name": pname, "numel": p.numel()}
                    else:
                        continue
                    site = self.module_sites.get(mod)
                    if site:
                        item["created_at"] = site
                    (not_in_opt if "has_grad" in item else unused).append(item)
        registered = {id(m) for r in roots for m in r.modules()}
        holders = roots + self._unrooted(registered)
        for h in holders[len(roots):]:
            namer.add_root(h)
        hidden = self._hidden_modules(holders, registered, namer, opt_params)
        min_steps = min((self.opt_steps.get(id(o), 0) for o in opts), default=0)
        ctx.emit("params_audit", step=ctx.step, final=final, optimizers=len(opts),
                 optimizer_steps=min_steps, trained_roots=[namer.module(m) for m in trained],
                 trainable=len(seen),
                 unused=unused[:50], unused_count=len(unused),
                 not_in_optimizer=not_in_opt[:50], not_in_optimizer_count=len(not_in_opt),
                 unregistered=hidden)

    def _unrooted(self, registered: set[int]) -> list:
        """Modules the script built that no root seen in forward holds, outermost first: a model
        whose own forward is never called (mnist_forward_forward trains each layer through
        ``layer.forward(x)``, so only its ReLUs are roots) still holds its layers."""
        built = [m for m, _site in list(self.module_sites.items())[:MAX_BUILT] if id(m) not in registered]
        inner = {id(c) for m in built for c in m.modules() if c is not m}
        return [m for m in built if id(m) not in inner]

    def _hidden_modules(self, roots: list, registered: set[int], namer, opt_params: set[int]) -> list:
        torch = self.torch
        Module = torch.nn.Module
        out = []
        walked: set[int] = set()
        for root in roots:
            for m in root.modules():
                if id(m) in walked:
                    continue
                walked.add(id(m))
                for attr, val in list(vars(m).items()):
                    if attr.startswith("_") and attr in ("_modules", "_parameters", "_buffers"):
                        continue
                    for where, sub in _modules_in(val, attr, Module):
                        if id(sub) in registered:
                            continue
                        params = [p for p in sub.parameters() if p.requires_grad]
                        if not params:
                            continue
                        out.append({"attribute": f"{namer.module(m)}.{where}",
                                    "container": type(val).__name__,
                                    "module_class": type(sub).__name__,
                                    "params": sum(p.numel() for p in params),
                                    "in_optimizer": any(id(p) in opt_params for p in params),
                                    "received_grad": any(p.grad is not None for p in params)})
                        registered.add(id(sub))
                        if len(out) >= 20:
                            return out
        return out


def _site_init(inst: TrainingGrads, orig: Any, book: Any, creation_site: Any) -> Any:
    """A constructor that runs ``orig`` then notes the user's line that called it."""

    def init(obj, *a, **k):
        orig(obj, *a, **k)
        if inst.live and os.getpid() == inst.pid and book.get(obj) is None:
            try:
                book.put(obj, creation_site(obj, 2))
            except Exception:  # noqa: BLE001 - a site is a nicety, never a failure
                pass

    init.__wrapped__ = orig
    return init


def _modules_in(val: Any, attr: str, Module: type, depth: int = 0):
    """(label, module) pairs held in a plain list/tuple/dict/set (two levels deep)."""
    if depth > 1:
        return
    if isinstance(val, (list, tuple, set)) and not isinstance(val, Module):
        for i, x in enumerate(val):
            if isinstance(x, Module):
                yield f"{attr}[{i}]", x
            elif isinstance(x, (list, tuple, dict)):
                yield from _modules_in(x, f"{attr}[{i}]", Module, depth + 1)
    elif isinstance(val, dict) and not isinstance(val, Module):
        for k, x in val.items():
            if isinstance(x, Module):
                yield f"{attr}[{k!r}]", x
            elif isinstance(x, (list, tuple, dict)):
                yield from _modules_in(x, f"{attr}[{k!r}]", Module, depth + 1)
