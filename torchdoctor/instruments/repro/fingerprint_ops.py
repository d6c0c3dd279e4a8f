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
fingerprinted. Everything is read once at the end. Ops run in forked DataLoader workers are not
recorded.

**Bounded** (issue 27: the window of step 1 of a script that prepares its data sample by sample
ran to hundreds of thousands of ops, and torch's DebugMode keeps a call object per op: 20 GB).
The first ``MAX_OPS`` ops of the window are recorded (the first difference is what is sought);
after them, or once the process has grown by ``TRACE_BUDGET_MB`` since the trace began (its
resident memory, read every ``CHECK_EVERY`` ops), nothing more is fingerprinted or kept: the ops
are only counted, with the names of the last ``TAIL`` in a ring. DebugMode's own list of calls
is cut to the recorded ones as the trace goes. Once the recording stopped the rest of the run
serves nothing: it is ended at once (``StopRun`` from the next op in the main thread; a step of
800,000 tiny ops would otherwise still pay the mode's ~0.1-1 ms per op). The event says where and
why it stopped.

Numbers among an op's arguments (not tensors: ``x + 0.3``) are digested too. Event: ``op_trace``
{step, engine, ops: [[name, phase, module_i, where_i, in|None, out|None, scalars]], strings:
[...], truncated, complete, seen (ops in the window), stopped: null | {reason: "ops" | "memory",
at_op, grown_mb, budget_mb, max_ops}, tail: [last op names], grown_mb (resident growth while
recording), skipped_layouts: {kind: n} (sparse, nested, meta... tensors: not read)}.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from typing import Any

from torchdoctor.instruments.base import Instrument, register

MAX_OPS = 20_000  # ops recorded, from the start of the window
TRACE_BUDGET_MB = 512  # growth of the process's resident memory while recording that stops it
CHECK_EVERY = 256  # ops between two reads of the resident memory
TAIL = 16  # names of the last ops seen after the recording stopped
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

        from torchdoctor.instruments.repro.fingerprint_reduce import reduce3
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
        self.seen = 0  # ops of the window seen (recorded or not)
        self.kept = 0  # ops recorded (debug_mode: records made at the end from DebugMode's calls)
        self.stopped: dict[str, Any] | None = None
        self.tail: deque = deque(maxlen=TAIL)
        self.rss0: float | None = None
        self.grown_mb = 0.0
        self.dm_keep = -1  # DebugMode's calls kept once the recording stopped
        self._strs: dict[str, str] = {}  # one copy of each name, module and place
        self.skipped: dict[str, int] = {}  # tensors of layouts not read (sparse, nested...), by kind
        self.halted = False
        self.main_ident = threading.main_thread().ident
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
                r = x if hashed else self._reduce3(torch, x)
                if r is None:  # sparse, nested, meta...: not read, counted
                    self._skip(x)
                    continue
                r = r * float(i)
                acc = r if acc is None else (acc + r if acc.device == r.device else acc + r.to(acc.device))
            elif isinstance(x, dict):
                stack.extend(reversed(list(x.values())))
            elif isinstance(x, (list, tuple)):
                stack.extend(reversed(x))
        return acc

    def _skip(self, t: Any) -> None:
        from torchdoctor.memory.layouts import unsupported

        kind = unsupported(t) or "unreadable"
        self.skipped[kind] = self.skipped.get(kind, 0) + 1

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
        strs = self._strs
        self.recs.append([strs.setdefault(name, name), where[0], strs.setdefault(where[1], where[1]),
                          strs.setdefault(where[2], where[2]), self._host(fin), self._host(fout), scal])

    def _host(self, fp: Any) -> Any:
        """A fingerprint on the CPU becomes three floats at once (no tensor kept per op: 20,000
        of them, with the allocator's fragments, cost ~100 MB); one on a device stays there until
        the end (no sync in the step)."""
        if fp is None or fp.device.type != "cpu":
            return fp
        return [_num(x) for x in fp.tolist()]

    # ------------------------------------------------------------------ the bound
    def _admit(self, name: str) -> bool:
        """Count one op of the window; True when it is to be recorded (module doc: the bound)."""
        self.seen += 1
        if self.stopped is None:
            if self.kept >= MAX_OPS:
                self._stop("ops")
            elif self.seen % CHECK_EVERY == 0:
                rss = _rss_mb()
                if rss is not None and self.rss0 is not None:
                    self.grown_mb = max(self.grown_mb, rss - self.rss0)
                    if self.grown_mb > TRACE_BUDGET_MB:
                        self._stop("memory")
        if self.stopped is not None:
            self.tail.append(name)
            self._halt()
            return False
        self.kept += 1
        return True

    def _halt(self) -> None:
        """End the run now (once, from the main thread only: never kill a thread of the script)."""
        if self.halted or threading.get_ident() != self.main_ident:
            return
        self.halted = True
        from torchdoctor.runner.context import StopRun

        why = "repro op trace stopped at its bound"
        self.ctx.request_stop(why)
        raise StopRun(why)

    def _stop(self, reason: str) -> None:  # count only from now on; DebugMode's list is cut here
        self.truncated = True
        self.stopped = {"reason": reason, "at_op": self.seen, "grown_mb": round(self.grown_mb, 1),
                        "budget_mb": TRACE_BUDGET_MB, "max_ops": MAX_OPS}
        self.dm_keep = len(self.dm.operators) if self.dm is not None else -1

    # ------------------------------------------------------------------ engines
    def _begin(self) -> None:
        if self.entered or self.done:
            return
        self.rss0 = _rss_mb()
        if self.engine == "debug_mode":
            DebugMode = self.dm_cls
            self.dm = DebugMode(record_output=False, record_profiler_context=False)
            inst = self

            zero = self.torch.zeros(3, dtype=self.torch.float64)

            def hash_fn(t: Any) -> Any:
                if inst.stopped is not None:
                    return zero  # not recorded: no work, nothing kept
                r = inst._reduce3(inst.torch, t)
                if r is None:
                    inst._skip(t)
                return r

            def where_hook(func, types, args, kwargs, result):
                if os.getpid() != inst.pid:
                    return None
                if not inst._admit(_qualname(func)):
                    ops = inst.dm.operators if inst.dm is not None else None
                    if ops is not None and 0 <= inst.dm_keep < len(ops):
                        del ops[inst.dm_keep:]  # DebugMode keeps every call: not past the bound
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
        if self.entered:
            rss = _rss_mb()
            if rss is not None and self.rss0 is not None:
                self.grown_mb = max(self.grown_mb, rss - self.rss0)
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
        fps = [(i, j, r[j]) for i, r in enumerate(self.recs) for j in (4, 5)
               if isinstance(r[j], torch.Tensor)]
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
                 truncated=self.truncated, complete=self.done, seen=self.seen, stopped=self.stopped,
                 tail=list(self.tail), grown_mb=round(self.grown_mb, 1), skipped_layouts=self.skipped)
        self.recs = []


def _rss_mb() -> float | None:
    """This process's resident memory in MiB (``/proc/self/statm``, a few us), else None."""
    from torchdoctor.memory.host import rss_bytes

    b = rss_bytes()
    return None if b is None else b / 2**20


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
    from torchdoctor.runner.patching import passthrough

    class OpHashes(TorchDispatchMode):
        """Fingerprints the inputs (before) and outputs (after) of every aten op."""

        @passthrough  # runs the user's op: its errors are the user's (runner/frames.py)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "namespace", "") == "profiler":  # record_function marks, not ops
                return func(*args, **kwargs)
            if os.getpid() != inst.pid:
                return func(*args, **kwargs)
            name = _qualname(func)
            if not inst._admit(name):
                return func(*args, **kwargs)
            skip = "empty" in name
            fin = None if skip else inst._fp((_inputs(name, args), kwargs))
            out = func(*args, **kwargs)
            fout = None if skip else inst._fp(out)
            inst._record(name, fin, fout, inst._where(), inst._scalars((args, kwargs)))
            return out

    return OpHashes()
