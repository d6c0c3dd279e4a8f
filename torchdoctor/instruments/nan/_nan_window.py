"""The forward watch's queue of the non-finite monitor (mixed into
:class:`torchdoctor.instruments.nan.nan_monitor.NanMonitor`; see its module doc): the window's
records, the tensors queued without device work (:meth:`WindowQueue._defer`) and their
reduction on the device (:meth:`WindowQueue._flush`), in batches of at most ``flush_bytes``
(:meth:`WindowQueue._budget`). Also the window and row types and the monitor's constants.
"""

from __future__ import annotations

from typing import Any, NamedTuple

FORCE_ROW_RECORDS = 50_000  # a window this long (eval loop without steps) is reduced early
FLUSH_AT = 512  # queued tensors reduced at once at the latest
# queued bytes reduced at once at the latest: the tensors held for the reduction raise the
# script's peak memory by about this much (those autograd does not keep anyway)
FLUSH_MIN_BYTES = 32 << 20
FLUSH_OF_ALLOCATED = 0.25  # at most this share of the CUDA memory allocated at backward start
FLUSH_OF_HEADROOM = 0.5  # and at most this share of the device memory not reserved then
INF = float("inf")
EMIT_EVERY = 32  # rows per ``numerics`` event
LEARN_CONTAINED = 3  # windows with contained -Inf (masks) inspected to learn benign modules
MAX_PENDING = 256  # CUDA rows not yet copied back before the oldest is waited for


class LossInfo(NamedTuple):
    """One tensor passed to ``backward`` in a window (formatted only when reported)."""

    shape: tuple
    dtype: Any
    scalar: bool
    after_records: int  # records of the window before it
    step: int

    def as_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": str(self.dtype).replace("torch.", ""),
                "scalar": self.scalar, "after_records": self.after_records, "step": self.step}


def _passthrough_types(torch: Any) -> frozenset:
    """Leaf module classes whose output is finite whenever their input is (see
    :meth:`NanMonitor._alias_passthrough`); exact classes, not subclasses."""
    nn = torch.nn
    names = ("ReLU", "ReLU6", "LeakyReLU", "Identity", "Flatten", "Unflatten", "Dropout",
             "Dropout1d", "Dropout2d", "Dropout3d", "MaxPool1d", "MaxPool2d", "MaxPool3d",
             "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d")
    return frozenset(getattr(nn, n) for n in names if hasattr(nn, n))


class _Window:
    """What one window recorded. ``recs[seq]`` = (role, module, cid, step, index, alias).

    Watched tensors wait in ``pend`` (per (dtype, device index): entries [tensor, version at
    record time, seq]) until :meth:`NanMonitor._flush` reduces them, then their per-record
    statistics sit in ``reduced`` (per (key, k): the 0-dim values, k per record, and the seqs)."""

    __slots__ = ("pend", "npend", "qbytes", "reduced", "modified", "last_entry", "inplace", "recs", "calls", "parents",
                 "grad_on", "losses", "loss_info", "stack", "last_out", "last_ver", "last_seq",
                 "order", "root_outs", "clip")

    def __init__(self) -> None:
        self.pend: dict[Any, list] = {}
        self.npend = 0
        self.qbytes = 0  # bytes of the queued tensors
        self.reduced: dict[Any, tuple[list, list]] = {}  # ((dtype, dev), k) -> (0-dim values, seqs)
        self.modified = 0  # records dropped: their tensor was modified in place before the flush
        self.last_entry: list | None = None  # pend entry of ``last_out`` (None once flushed)
        self.inplace: dict[int, int] = {}  # seq -> seq of the same tensor before an in-place op
        self.recs: list[tuple] = []
        self.calls: list[Any] = []  # cid -> module
        self.parents: list[int] = []  # cid -> parent cid (-1: root call)
        self.grad_on: list[bool] = []  # cid -> grad mode at the call
        self.losses: list[Any] = []  # detached: scalar losses as given, others [min, max] float32 (float64 kept)
        self.loss_info: list[LossInfo] = []
        self.stack: list[tuple[Any, int]] = []
        self.last_out = None
        self.last_ver = -1
        self.last_seq = -1
        self.order: dict[int, int] = {}  # id(module) -> seq of its last output
        self.root_outs: list[int] = []  # seqs of root modules' outputs
        self.clip: tuple[Any, float] | None = None  # (total norm before clipping, max_norm): last clip_grad_norm_

    def empty(self) -> bool:
        return not self.recs and not self.losses


class _Row:
    __slots__ = ("step", "opt", "row", "win", "params", "norms", "stacks", "loss_vec", "live",
                 "layout", "gnorm64", "neg_inf_before", "handle", "clip_max", "sharded",
                 "elsewhere")

    def __init__(self, step, opt, row, win, params, norms, stacks, loss_vec, layout):
        self.step, self.opt, self.row, self.win = step, opt, row, win
        self.params, self.norms, self.stacks, self.loss_vec = params, norms, stacks, loss_vec
        self.layout = layout  # names of the row's entries
        self.live = True
        self.gnorm64: float | None = None  # float64 norm when the float32 one overflowed
        self.neg_inf_before: int | None = None  # an earlier -Inf-only record (a mask?)
        self.handle: Any = None  # CudaRowReader handle (None: a CPU row, read directly)
        self.clip_max: float | None = None  # max_norm of a clip_grad_norm_ in the window
        self.sharded = False  # some gradients are DTensor shards: the norm was summed over meshes
        self.elsewhere = False  # sharded, the summed norm not finite, every local shard finite


class WindowQueue:
    """Mixin of the monitor: queue and reduce the watched tensors of the window."""

    @staticmethod
    def _defer(ts, role, module, cid, w, step) -> None:
        """Record each tensor; queue it for the window's next :meth:`_flush` (no device work)."""
        for i, t in enumerate(ts):
            seq = len(w.recs)
            try:
                ver = t._version
            except RuntimeError:  # inference tensors have no version counter
                ver = None
            if t is w.last_out:
                if ver == w.last_ver:
                    # the tensor recorded just before, unmodified since: an alias, nothing queued
                    w.recs.append((role, module, cid, step, i, w.last_seq))
                    continue
                if w.last_entry is not None and w.last_entry[0] is t:
                    w.inplace[seq] = w.last_seq  # modified in place by the caller in between
            key = (t.dtype, t.get_device())  # device index (-1: CPU): no device object made
            lst = w.pend.get(key)
            if lst is None:
                lst = w.pend[key] = []
            entry = [t, ver, seq]
            lst.append(entry)
            w.npend += 1
            w.qbytes += t.nbytes
            w.recs.append((role, module, cid, step, i, -1))
            w.last_out = t if ver is not None else None
            w.last_ver = ver
            w.last_seq = seq
            w.last_entry = entry

    def _flush(self, w: _Window) -> None:
        """Reduce the window's queued tensors on their device, one fused call per (dtype,
        device) on CUDA: per record, ``max |x|`` (``torch._foreach_norm(ord=inf)``: NaN
        propagates, an Inf is the max). Elsewhere ``torch.aminmax`` per tensor (the CPU's
        inf-norm is 10x slower), giving [min, max]. Both are exact for finiteness.

        A tensor whose version moved since it was recorded was modified in place (the caller's
        ``out += identity``): its record is dropped (the values it had are gone); the next
        module that receives it checks it as an input. Queued tensors are released here."""
        if not w.npend:
            return
        self.flushes += 1
        torch = self.torch
        grad_on, set_grad = self._grad_mode
        was_on = grad_on()
        if was_on:
            set_grad(False)  # nothing recorded for autograd
        try:
            for key, lst in w.pend.items():
                ts, seqs = [], []
                for t, ver, seq in lst:
                    if ver is not None and t._version != ver:
                        w.modified += 1
                        continue
                    ts.append(t)
                    seqs.append(seq)
                if not ts:
                    continue
                vals = None
                if self.fused and (ts[0].is_cuda or self.fused_cpu):
                    try:
                        vals = self._fused_norm(ts, INF)  # 0-dim max |x| per tensor
                        k = 1
                    except (RuntimeError, NotImplementedError, TypeError):
                        self.fused = False  # an older torch, a tensor subclass: per tensor
                if vals is None:
                    vals = []
                    if key[0].is_complex:  # [min, max] over the real and imaginary parts
                        ts = [self._as_real(t) for t in ts]
                    for t in ts:
                        vals.extend(self._aminmax(t))
                    k = 2
                got = w.reduced.get((key, k))
                if got is None:
                    w.reduced[(key, k)] = (list(vals), seqs)
                else:
                    got[0].extend(vals)
                    got[1].extend(seqs)
        finally:
            if was_on:
                set_grad(True)
            # released even when the reduction failed (e.g. out of memory): never hold them
            w.pend = {}
            w.npend = 0
            w.qbytes = 0
            w.last_entry = None

    # ------------------------------------------------------------------ loss
    def _budget(self, dev: int) -> int:
        """Bytes the forward watch may queue before reducing (``flush_bytes``), set when
        backward begins, when the step holds about its most: a quarter of the CUDA memory
        allocated, at most half of the device memory not reserved by PyTorch's allocator (a
        script near its memory limit gets small batches, not an out-of-memory), at least
        32 MiB. Fewer, larger batches cost less host time (one fused call per batch)."""
        cuda = self.torch.cuda
        if not cuda.is_initialized():
            return FLUSH_MIN_BYTES
        if self.total_mem is None:
            self.total_mem = cuda.get_device_properties(dev).total_memory
        headroom = max(0, self.total_mem - cuda.memory_reserved(dev))
        want = min(cuda.memory_allocated(dev) * FLUSH_OF_ALLOCATED, headroom * FLUSH_OF_HEADROOM)
        return max(FLUSH_MIN_BYTES, int(want))
