"""Op trace: every aten op of one step, with a fingerprint of its inputs and outputs, to compare
two runs op by op (``repro``'s localising pair).

Idle unless the option ``repro_ops`` = {"step": S} is set (only when the first pair of runs
diverged, at step S). The ops of step S (from the boundary of step S-1; for S = 1 from start-up,
so that initialisation is seen too) are recorded, then the run ends at S (its ``--steps``):

* engine ``debug_mode`` (torch with ``torch.utils._debug_mode.DebugMode.log_tensor_hashes``,
  2.13): torch's own tensor-hashing debug mode, with our hash function (the float64
  ``[sum, sum of squares, strided sum]`` of :mod:`.fingerprint_reduce`, kept on the device) on
  inputs (before the op: in-place ops overwrite them) and outputs, and a log hook that adds
  where the op ran;
* engine ``dispatch`` (older torch, or option ``engine``): a ``TorchDispatchMode`` that does the
  same.

Per op: its name (``aten::index_add_``), the phase (forward, backward, optimizer, data, other: the step clock's), the
module running it (global forward hooks: the innermost module called, named under its root)
and the user's file:line. The tensors of one op's inputs (and of its outputs) are combined into
one position-weighted ``[sum, sumsq, strided]``; ``empty*`` ops (uninitialised memory) are not
fingerprinted. At most ``MAX_OPS`` ops; everything is read once at the end. Ops run in forked
DataLoader workers are not recorded.

Numbers among an op's arguments (not tensors: ``x + 0.3``) are digested too. Event: ``op_trace``
{step, engine, ops: [[name, phase, module_i, where_i, in|None, out|None, scalars]], strings:
[...], truncated, complete}.
"""

from __future__ import annotations

import math
import os
from typing import Any

from torchdoctor.instruments import Instrument, register

MAX_OPS = 20_000
# in-place ops that overwrite their first argument without reading it: its old values (often
# uninitialised memory from ``empty``) are not an input
OVERWRITE_OPS = frozenset({"uniform_", "normal_", "random_", "exponential_", "geometric_",
                           "cauchy_", "log_normal_", "bernoulli_", "fill_", "zero_", "copy_",
                           "set_", "resize_", "resize_as_"})


def _num(x: float) -> Any:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


@register
class FingerprintOps(Instrument):
    name = "fingerprint_ops"
    produces = frozenset({"op_trace"})
    priority = 88

    def install(self, ctx: Any) -> None:
        spec = ctx.options.get("repro_ops")
        self.active = bool(spec)
        if not self.active:
            return
        import torch
        from torch.nn.modules import module as mod_mod

        from torchdoctor.instruments.fingerprint_reduce import reduce3
        from torchdoctor.torch_internals import debug_mode_class

        self.torch, self.ctx = torch, ctx
        self._reduce3 = reduce3
        self.step = int(spec["step"])
        want = spec.get("engine") or "auto"
        self.dm_cls = debug_mode_class() if want in ("auto", "debug_mode") else None
        self.engine = "debug_mode" if self.dm_cls is not None else "dispatch"
        self.pid = os.getpid()
        self.recs: list[list] = []  # [name, phase, module, where, in_fp, out_fp]
        self.truncated = False
        self.done = False
        self.entered: list[Any] = []  # context managers entered, exited in reverse
        self.dm = None
        self.mstack: list[Any] = []
        self.namer = None
        self.namer_seen = -1
        self.handles = [mod_mod.register_module_forward_pre_hook(self._pre),
                        mod_mod.register_module_forward_hook(self._post, always_call=True)]
        if self.step <= 1:
            self._begin()

    # ------------------------------------------------------------------ where an op ran
    def _pre(self, module: Any, args: Any) -> None:
        if self.entered and self.ctx.in_owner_thread():
            self.mstack.append(module)

    def _post(self, module: Any, args: Any, out: Any) -> None:
        if self.entered and self.mstack and self.ctx.in_owner_thread():
            self.mstack.pop()

    def _where(self) -> tuple[str, str, str]:
        from torchdoctor.runner.frames import short_path, user_frame

        m = self.mstack[-1] if self.mstack else None
        if m is None:
            mod = ""
        else:
            if self.namer is None or (id(m) not in self.namer.modules
                                      and self.ctx.models_seen != self.namer_seen):
                from torchdoctor.numerics.names import Namer

                self.namer_seen = self.ctx.models_seen  # rebuilt only when a new root appeared
                self.namer = Namer(self.ctx.models())
            mod = self.namer.modules.get(id(m)) or type(m).__name__
        uf = user_frame(3)
        return self.ctx.phase, mod, (short_path(f"{uf[0]}:{uf[1]}") if uf else "")

    def _fp(self, obj: Any, hashed: bool = False) -> Any:
        """Position-weighted sum of the fingerprints of the tensors in ``obj`` (or None);
        ``hashed``: the tensors are fingerprints already (DebugMode's hash tree)."""
        torch = self.torch
        acc = None
        i = 0
        stack = [obj]
        while stack and i < 32:
            x = stack.pop()
            if isinstance(x, torch.Tensor):
                i += 1
                r = (x if hashed else self._reduce3(torch, x)) * float(i)
                acc = r if acc is None else (acc + r if acc.device == r.device else acc + r.to(acc.device))
            elif isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            elif isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
        return acc

    def _scalars(self, obj: Any) -> str:
        """A digest of the numbers among an op's arguments (not tensors): an op fed a different
        Python number has different inputs too."""
        torch = self.torch
        vals: list = []
        stack = [obj]
        while stack and len(vals) < 64:
            x = stack.pop()
            if isinstance(x, (bool, int, float, complex)):
                vals.append(x)
            elif isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            elif isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
                stack.extend(reversed(x))
        if not vals:
            return ""
        import hashlib

        return hashlib.blake2b(repr(vals).encode(), digest_size=6).hexdigest()

    def _record(self, name: str, fin: Any, fout: Any, where: tuple[str, str, str],
                scal: str = "") -> None:
        if len(self.recs) >= MAX_OPS:
            self.truncated = True
            return
        self.recs.append([name, *where, fin, fout, scal])

    # ------------------------------------------------------------------ engines
    def _begin(self) -> None:
        if self.entered or self.done:
            return
        if self.engine == "debug_mode":
            DebugMode = self.dm_cls
            self.dm = DebugMode(record_output=False, record_profiler_context=False)
            inst = self

            def hash_fn(t: Any) -> Any:
                return inst._reduce3(inst.torch, t)

            def where_hook(func, types, args, kwargs, result):
                if os.getpid() != inst.pid:
                    return None
                return {"td_where": inst._where(), "td_scalars": inst._scalars((args, kwargs))}

            for cm in (self.dm, DebugMode.log_tensor_hashes(hash_fn=hash_fn, hash_inputs=True),
                       DebugMode.dispatch_hooks(log_hook=where_hook)):
                cm.__enter__()
                self.entered.append(cm)
        else:
            from torchdoctor.torch_internals import dispatch_mode_base

            mode = _make_mode(dispatch_mode_base(), self)
            mode.__enter__()
            self.entered.append(mode)

    def _end(self) -> None:
        while self.entered:
            cm = self.entered.pop()
            try:
                cm.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass
        if self.dm is not None:
            self._collect_debug_mode(self.dm)
            self.dm = None

    def _collect_debug_mode(self, dm: Any) -> None:
        for call in dm.operators:
            log = getattr(call, "log", None)
            op = getattr(call, "op", None)
            if not log or op is None or "td_where" not in log:
                continue
            name = _qualname(op)
            ih = log.get("input_hash")
            if name.rpartition("::")[2] in OVERWRITE_OPS and isinstance(ih, (tuple, list)) and ih and isinstance(ih[0], (tuple, list)):
                ih = (_inputs(name, ih[0]), *ih[1:])
            self._record(name, self._fp(ih, hashed=True), self._fp(log.get("hash"), hashed=True),
                         log["td_where"], log.get("td_scalars", ""))

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.active or self.done:
            return
        if step == self.step - 1:
            self._begin()
        elif step >= self.step:
            self._end()
            self.done = True
            ctx.request_stop("repro op trace recorded")

    def uninstall(self, ctx: Any) -> None:
        if not self.active:
            return
        for h in self.handles:
            h.remove()
        self._end()
        torch = self.torch
        fps = [(i, j, r[j]) for i, r in enumerate(self.recs) for j in (4, 5) if r[j] is not None]
        by_dev: dict[Any, list] = {}
        for item in fps:
            by_dev.setdefault(item[2].device, []).append(item)
        for items in by_dev.values():
            vals = torch.stack([t for _i, _j, t in items]).tolist()
            for (i, j, _t), v in zip(items, vals):
                self.recs[i][j] = [_num(x) for x in v]
        strings: dict[str, int] = {}

        def intern(s: str) -> int:
            return strings.setdefault(s, len(strings))

        ops = [[r[0], r[1], intern(r[2]), intern(r[3]), r[4], r[5], r[6]] for r in self.recs]
        ctx.emit("op_trace", step=self.step, engine=self.engine, ops=ops, strings=list(strings),
                 truncated=self.truncated, complete=self.done)
        self.recs = []


def _qualname(func: Any) -> str:
    """``aten::index_add_``, ``mylib::scatter_sum``: the op's namespace and overload packet."""
    packet = getattr(getattr(func, "overloadpacket", None), "__name__", None)
    if packet is None:
        return str(func)
    return f"{getattr(func, 'namespace', 'aten')}::{packet}"


def _inputs(name: str, args: Any) -> Any:
    """An op's positional inputs, without the first when the op only overwrites it."""
    if name.rpartition("::")[2] in OVERWRITE_OPS and args:
        return tuple(args[1:])
    return args


def _make_mode(TorchDispatchMode: Any, inst: FingerprintOps) -> Any:
    class OpHashes(TorchDispatchMode):
        """Fingerprints the inputs (before) and outputs (after) of every aten op."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "namespace", "") == "profiler":  # record_function marks, not ops
                return func(*args, **kwargs)
            if os.getpid() != inst.pid or len(inst.recs) >= MAX_OPS:
                if os.getpid() == inst.pid:
                    inst.truncated = True
                return func(*args, **kwargs)
            name = _qualname(func)
            skip = "empty" in name
            fin = None if skip else inst._fp((_inputs(name, args), kwargs))
            out = func(*args, **kwargs)
            fout = None if skip else inst._fp(out)
            inst._record(name, fin, fout, inst._where(), inst._scalars((args, kwargs)))
            return out

    return OpHashes()
