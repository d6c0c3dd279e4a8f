"""Custom autograd Functions: capture a few real calls, watch for misuse, check them after the run.

``torch.autograd.Function.apply`` (a classmethod; feature-detected, nothing is patched when it is
not one) is wrapped for the run. For every Function subclass defined outside torch (and outside
torchdoctor) it:

* counts the calls and notes where the Function is defined (forward and backward ``file:line``);
* **samples** up to ``--samples`` calls (default 3, distinct input shapes preferred) that build a
  graph, copying their arguments *before* the forward runs (``gradcheck/capture.py``: detached
  host copies, bounded bytes), with the shapes, dtypes, which inputs require grad and the user's
  call site;
* watches each call (the first ``DIRTY_WATCH_CALLS`` of each Function) for **an input modified in
  place without ``ctx.mark_dirty``** (the input's version counter moved during the forward, the
  input is part of the graph, and autograd did not rebase it on the Function's node) and for
  **tensors stashed as ctx attributes** (``ctx.x = x`` instead of ``ctx.save_for_backward(x)``:
  the ctx's ``__dict__`` holds a tensor), each reported once per Function.

After the script ends (in ``uninstall``, after the patch is undone, also after a crash or the
``--steps`` stop) every sampled call is checked in float64 on copies (``gradcheck/runall.py``),
within ``--budget`` seconds and before the run's ``--timeout``. Nothing is stored on the user's
objects; the copies live in this instrument only.

Events: ``autograd_function`` {function, module, forward_at, backward_at, calls, sampled,
graph_calls, skipped}; ``autograd_dirty`` {function, arg, shape, requires_grad, leaf, call_site,
forward_at, call}; ``autograd_ctx_tensors`` {function, attrs: [{name, shape, dtype, role}],
call_site, forward_at, backward_at}; ``gradcheck_call`` (one per sampled call, see
``gradcheck/check.py``); ``gradcheck_summary`` {functions, sampled, checked, seconds, budget_s,
capture}.
"""

from __future__ import annotations

import os
import time
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.runner.patching import Patches, passthrough

SKIP_MODULES = ("torch.", "torchdoctor.", "functorch.")


def code_at(fn: Any) -> str | None:
    import inspect

    try:
        fn = inspect.unwrap(fn)
    except Exception:  # noqa: BLE001
        pass
    co = getattr(fn, "__code__", None)
    if co is None:
        return None
    import linecache

    line = co.co_firstlineno  # the first decorator's line: move to the ``def``
    for k in range(line, line + 8):
        if linecache.getline(co.co_filename, k).lstrip().startswith(("def ", "async def ")):
            line = k
            break
    return f"{co.co_filename}:{line}"


@register
class AutogradCapture(Instrument):
    name = "autograd_capture"
    produces = frozenset({"autograd_function", "autograd_dirty", "autograd_ctx_tensors",
                          "gradcheck_call", "gradcheck_summary"})
    priority = 62

    live = False

    def install(self, ctx: Any) -> None:
        import torch

        from torchdoctor.gradcheck.capture import SampleBook

        self.torch, self.ctx = torch, ctx
        self.t0 = time.monotonic()
        self.pid = os.getpid()
        self.book = SampleBook(int(ctx.options.get("samples") or 3))
        self.infos: dict[Any, dict[str, Any]] = {}
        self.wanted: dict[Any, bool] = {}
        self.busy = False
        self._patches = Patches()
        raw = vars(torch.autograd.Function).get("apply")
        if not isinstance(raw, classmethod):
            self.capture = "not captured: torch.autograd.Function.apply is not a classmethod here"
            return
        self.capture = "Function.apply"
        orig = raw.__func__
        inst = self
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

        def apply(cls, *args, **kwargs):
            if (not inst.live or inst.busy or not inst._wanted(cls) or compiling()
                    or not inst.ctx.in_owner_thread()):
                return orig(cls, *args, **kwargs)
            return inst._captured(orig, cls, args, kwargs, "apply", True)

        self._patches.set(torch.autograd.Function, "apply", classmethod(apply), raw)
        self._patch_custom_ops(compiling)
        self.live = True

    def _patch_custom_ops(self, compiling) -> None:
        """``torch.library.custom_op`` objects: their calls go through the dispatcher, not
        ``Function.apply``; ``CustomOpDef.__call__`` is wrapped the same way (calls with keyword
        arguments, and ``torch.ops.ns.op(...)`` calls, are not captured)."""
        from torchdoctor import torch_internals as ti

        cod = ti.custom_op_def_class()
        if cod is None:
            return
        inst = self

        def make(orig):
            def call(op, *args, **kwargs):
                if (not inst.live or inst.busy or kwargs or compiling()
                        or not inst.ctx.in_owner_thread()):
                    return orig(op, *args, **kwargs)
                return inst._captured(orig, op, args, kwargs, "custom_op", False)
            return call

        if self._patches.wrap(cod, "__call__", make, tag="td-custom-op", require=False) is not None:
            self.capture += " + CustomOpDef.__call__"

    @passthrough  # calls what the user called: its errors are the user's (runner/frames.py)
    def _captured(self, orig: Any, target: Any, args: tuple, kwargs: dict, where: str, watch: bool) -> Any:
        """One captured call of ``orig(target, *args, **kwargs)``: inputs recorded before, outputs
        after; a failure of the capture turns it off and never reaches the script."""
        pre = None
        try:
            pre = self._before(target, args, watch=watch)
        except Exception:  # noqa: BLE001
            self._failed(where)
        self.busy = True
        try:
            out = orig(target, *args, **kwargs)
        finally:
            self.busy = False
        if pre is not None:
            try:
                self._after(target, args, out, pre)
            except Exception:  # noqa: BLE001
                self._failed(where)
        return out

    def _failed(self, where: str) -> None:
        self.live = False
        self.hook_failed(self.ctx, where)

    def _wanted(self, cls: Any) -> bool:
        hit = self.wanted.get(cls)
        if hit is None:
            mod = getattr(cls, "__module__", "") or ""
            hit = not (mod == "torch" or mod.startswith(SKIP_MODULES) or mod == "torchdoctor")
            self.wanted[cls] = hit
        return hit

    # ------------------------------------------------------------------ per call
    def _info(self, cls: Any) -> dict[str, Any]:
        info = self.infos.get(cls)
        if info is None and not isinstance(cls, type):  # a torch.library custom op
            from torchdoctor import torch_internals as ti

            f = ti.custom_op_facts(cls)
            info = {"function": str(f["name"]), "module": "torch.library", "is_op": True,
                    "inputs": _param_names(f["fn"]), "forward_at": code_at(f["fn"]),
                    "backward_at": code_at(f["backward"]) if f["backward"] else None,
                    "calls": 0, "graph_calls": 0, "dirty": True, "ctx": True, "user_code": None}
            self.infos[cls] = info
        if info is None:
            back = getattr(cls, "backward", None)
            vjp = getattr(cls, "vjp", None)
            base = self.torch.autograd.Function
            if vjp is not None and vjp is not getattr(base, "vjp", None) and back is getattr(base, "backward", None):
                back = vjp
            info = {"function": getattr(cls, "__qualname__", str(cls)), "module": cls.__module__,
                    "inputs": _input_names(cls, base),
                    "forward_at": code_at(getattr(cls, "forward", None)),
                    "backward_at": code_at(back), "calls": 0, "graph_calls": 0,
                    "dirty": False, "ctx": False}
            info["user_code"] = _in_user_file(info["forward_at"])
            self.infos[cls] = info
        return info

    def _before(self, cls: Any, args: tuple, watch: bool = True) -> tuple:
        from torchdoctor.gradcheck.capture import checkable, copy_call, signature
        from torchdoctor.instruments._sites import call_site

        torch = self.torch
        info = self._info(cls)
        info["calls"] += 1
        watch = watch and info["calls"] <= self._watch_calls() and not (info["dirty"] and info["ctx"])
        versions = _versions(torch, args) if watch and torch.is_grad_enabled() else None
        record = None
        if checkable(torch, args):
            info["graph_calls"] += 1
            sig = signature(torch, args)
            where = self.book.wants(cls, sig)
            if where is not None:
                try:
                    copied = copy_call(torch, args, self.book.room())
                except Exception as e:  # noqa: BLE001 - a tensor that cannot be copied: not sampled
                    copied = {"skip": f"the arguments could not be copied: {type(e).__name__}"}
                if copied.get("skip"):
                    self.book.skip(cls, copied["skip"])
                else:
                    record = {"sig": sig, "where": where, **copied,
                              "requires": [bool(isinstance(a, torch.Tensor) and a.requires_grad)
                                           for a in args],
                              "device": _device(torch, args),
                              "shapes": [list(a.shape) if isinstance(a, torch.Tensor) else None for a in args],
                              "dtypes": [str(a.dtype).replace("torch.", "") if isinstance(a, torch.Tensor)
                                         else type(a).__name__ for a in args],
                              "call": info["calls"], "step": self.ctx.step, "site": call_site(3)}
        return versions, record

    def _watch_calls(self) -> int:
        from torchdoctor.gradcheck.limits import DIRTY_WATCH_CALLS

        return DIRTY_WATCH_CALLS

    def _after(self, cls: Any, args: tuple, out: Any, pre: tuple) -> None:
        versions, record = pre
        if record is not None:
            where = record.pop("where")
            self.book.put(cls, where, record)
        if versions is None:
            return
        torch = self.torch
        info = self.infos[cls]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        node = None
        for o in outs:
            gf = getattr(o, "grad_fn", None) if isinstance(o, torch.Tensor) else None
            if gf is not None and getattr(type(gf), "_forward_cls", None) is cls:
                node = gf
                break
        if not info["dirty"]:
            self._dirty(cls, info, args, versions, node)
        if not info["ctx"] and node is not None:
            self._ctx_tensors(cls, info, args, outs, node)

    def _dirty(self, cls, info, args, versions, node) -> None:
        from torchdoctor.instruments._sites import call_site

        for k, (a, v0) in enumerate(versions):
            if a._version == v0:
                continue
            in_graph = a.requires_grad or a.grad_fn is not None
            if not in_graph or (node is not None and a.grad_fn is node):
                continue  # not part of autograd (a buffer), or marked dirty (rebased on the node)
            info["dirty"] = True
            arg = next((i for i, x in enumerate(args) if x is a), k)
            self.ctx.emit("autograd_dirty", function=info["function"], arg=arg, shape=list(a.shape),
                          requires_grad=bool(a.requires_grad), leaf=bool(a.is_leaf),
                          call_site=call_site(4), forward_at=info["forward_at"], call=info["calls"],
                          user_code=info["user_code"])
            return

    def _ctx_tensors(self, cls, info, args, outs, node) -> None:
        from torchdoctor.instruments._sites import call_site

        torch = self.torch
        try:
            attrs = dict(vars(node))
        except TypeError:
            return
        found = []
        for name, val in attrs.items():
            items = val if isinstance(val, (list, tuple)) else (val,)
            for t in items[:8]:
                if isinstance(t, torch.Tensor):
                    found.append({"name": str(name)[:80], "shape": list(t.shape),
                                  "dtype": str(t.dtype).replace("torch.", ""),
                                  "role": _role(torch, t, args, outs)})
                    break
        if found:
            info["ctx"] = True
            self.ctx.emit("autograd_ctx_tensors", function=info["function"], attrs=found[:12],
                          call_site=call_site(4), forward_at=info["forward_at"], user_code=info["user_code"],
                          backward_at=info["backward_at"], call=info["calls"])

    # ------------------------------------------------------------------ after the run
    def uninstall(self, ctx: Any) -> None:
        self.live = False
        self._patches.undo()
        if not hasattr(self, "infos"):
            return
        for cls, info in self.infos.items():
            kept = self.book.kept.get(cls, [])
            ctx.emit("autograd_function", **{k: v for k, v in info.items() if k not in ("dirty", "ctx")},
                     sampled=len(kept), skipped=self.book.skipped.get(cls, {}))
        from torchdoctor.gradcheck.runall import check_all

        budget = float(ctx.options.get("budget") or 0) or None
        timeout = ctx.options.get("timeout")
        left = float(timeout) - (time.monotonic() - self.t0) - 10.0 if timeout else None
        try:
            summary = check_all(self.torch, self.book, self.infos, ctx.emit, budget, left)
        except Exception as e:  # noqa: BLE001 - e.g. a CUDA context broken by the script's crash
            summary = {"sampled": sum(len(v) for v in self.book.kept.values()), "checked": 0,
                       "error": f"{type(e).__name__}: {str(e)[:300]}"}
        ctx.emit("gradcheck_summary", capture=self.capture, functions=len(self.infos), **summary)
        self.book.kept.clear()


def _in_user_file(at: str | None) -> bool:
    """Is ``file:line`` in the script's own files (not a library's)?"""
    from torchdoctor.runner.frames import is_user_file

    return bool(at) and is_user_file(at.rpartition(":")[0])


def _param_names(fn: Any) -> list[str]:
    import inspect

    try:
        return [p.name[:40] for p in inspect.signature(fn).parameters.values()][:32]
    except (TypeError, ValueError):
        return []


def _input_names(cls: Any, base: Any) -> list[str]:
    """forward's parameter names, ctx left out (none with a separate setup_context)."""
    import inspect

    try:
        params = [p.name for p in inspect.signature(cls.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []
    if getattr(cls, "setup_context", None) is getattr(base, "setup_context", None):
        params = params[1:]
    return [str(p)[:40] for p in params[:32]]


def _versions(torch, args: tuple) -> list | None:
    """(tensor, version counter) of the tensor arguments; None when one has no counter (an
    inference tensor): then that call is not watched."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            try:
                out.append((a, a._version))
            except Exception:  # noqa: BLE001 - inference tensors track no version
                return None
    return out


def _device(torch, args: tuple) -> str:
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return str(a.device)
    return "cpu"


def _role(torch, t, args: tuple, outs: tuple) -> str:
    for i, a in enumerate(args):
        if t is a:
            return f"input {i}"
    for i, o in enumerate(outs):
        if t is o:
            return f"output {i}"
    try:
        ptr = t.untyped_storage().data_ptr()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and ptr and a.untyped_storage().data_ptr() == ptr:
                return f"view of input {i}"
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and ptr and o.untyped_storage().data_ptr() == ptr:
                return f"view of output {i}"
    except Exception:  # noqa: BLE001
        pass
    return "intermediate"
