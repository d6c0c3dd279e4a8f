"""Which lines allocate the memory that outlives its step: growing allocation sites.

Two measurements, both armed only on a short window of steps (never on every step):

* :class:`DispatchTracker` (CPU and CUDA): a ``TorchDispatchMode`` sees every op's output;
  each new storage (outputs that alias an input - views, in-place, ``out=`` - are skipped,
  from the op's schema) is recorded with its bytes, the step it was created in and the user's
  ``file:line`` (weak references only: it keeps nothing alive). At the window end, storages
  still alive that were created before the window's last step are *survivors*. It also
  measures the size of the autograd graph hanging off tensors created in the window, or
  updated in place in it, which names the classic ``total = total + loss`` leak and its
  in-place form ``total_loss += loss`` (the graph grows, no tensor survives; the in-place sum
  was made before the window, so only its in-place updates name the line).
  Cost while armed: one Python call per op (~10-30 us); nothing outside the window.
* :func:`survivors_from_snapshots` (CUDA): allocator snapshots (memory history on, Python
  stacks) at each step boundary of the window; a block is a survivor when it appeared during
  the window, before its last step, and stayed allocated until the end.

Survivors are grouped by their innermost user frame (:func:`group_sites`).
"""

from __future__ import annotations

import sys
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from torchdoctor.memory.frames import fmt_site, loc, user_frames_from_frame, user_frames_from_snapshot

Frames = tuple  # tuple[tuple[filename, line, funcname], ...], innermost first


@dataclass(frozen=True)
class Survivor:
    nbytes: int
    step: int  # step in which it was allocated
    frames: Frames


def group_sites(survivors: Iterable[Survivor], n_steps: int, top: int = 5) -> list[dict[str, Any]]:
    """Survivors grouped by innermost user frame, biggest first.

    ``n_steps``: how many steps the survivors could come from (window length - 1), used for
    the per-step rate. Each site: site ('file:line'), function, bytes, count, bytes_per_step,
    called_from (outer user frames).
    """
    by: dict[Any, list[Survivor]] = defaultdict(list)
    for s in survivors:
        by[s.frames[:1]].append(s)
    out = []
    for key, items in by.items():
        frames = max((s.frames for s in items), key=len)
        total = sum(s.nbytes for s in items)
        out.append({
            "site": fmt_site(frames) if key else "(no user frame)",
            "function": frames[0][2] if frames else "",
            "bytes": total,
            "count": len(items),
            "bytes_per_step": round(total / max(1, n_steps)),
            "called_from": [loc(f) for f in frames[1:]],
        })
    out.sort(key=lambda d: -d["bytes"])
    return out[:top]


# ---- graph size -------------------------------------------------------------------------

def graph_size(grad_fn: Any, cap: int = 20000) -> int:
    """Number of autograd nodes reachable from ``grad_fn`` (stops counting at ``cap``)."""
    if grad_fn is None:
        return 0
    seen = {grad_fn}
    stack = [grad_fn]
    while stack and len(seen) < cap:
        node = stack.pop()
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return len(seen)


# ---- dispatch-mode tracker ----------------------------------------------------------------

def _make_mode_class():
    from torchdoctor.runner.patching import passthrough
    from torchdoctor.torch_internals import dispatch_mode_base, dynamo_loaded

    TorchDispatchMode = dispatch_mode_base()

    class _AllocMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo, which imports
            # torch._dynamo (and inductor, sympy...) on the first op: 1.6 s on the CPU box, 40 s
            # under the window's tracemalloc. Only worth it when the script already uses dynamo.
            return dynamo_loaded()

        def __init__(self, tracker: "DispatchTracker"):
            super().__init__()
            self.tracker = tracker

        @passthrough  # runs the user's op: its errors are the user's (runner/frames.py)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            try:
                self.tracker._record_inputs(args)
                self.tracker._record(func, out)
            except Exception:  # noqa: BLE001 - never break the user's op
                pass
            return out

    return _AllocMode


class DispatchTracker:
    """Track storages created by ops during a window of steps (see module docstring)."""

    MAX_RECORDS = 200_000  # stop recording new storages beyond this (bounded memory)
    MAX_INPLACE = 5_000  # tensors updated in place whose graph is measured (bounded memory)

    def __init__(self, min_bytes: int = 1) -> None:
        self.min_bytes = min_bytes
        self.step = 0
        self.first_step = 0
        # data_ptr -> (storage weakref, tensor weakref|None, nbytes, step, frames, on CPU)
        self._rec: dict[int, tuple] = {}
        from torchdoctor.memory.layouts import Skipped

        self.skipped = Skipped()  # tensors of layouts without a storage to read (sparse, meta, ...)
        self._alias: dict[Any, tuple[bool, ...]] = {}
        self._writes: dict[Any, bool] = {}
        # id(tensor) -> (tensor weakref, frames): tensors updated in place (``+=``) in the window
        self._inplace: dict[int, tuple] = {}
        # data_ptr -> (storage weakref, nbytes, step first used): CPU inputs of ops made outside
        # the window's ops (batches from DataLoader workers, parameters): live bytes only
        self._inputs: dict[int, tuple] = {}
        self._mode = None
        self._tensor_type = None
        self.active = False
        self.graph_sizes: list[dict[Any, int]] = []  # per boundary: site frames -> max nodes

    @staticmethod
    def supported() -> bool:
        try:
            _make_mode_class()
            return True
        except Exception:  # noqa: BLE001
            return False

    def start(self, step: int) -> bool:
        """Arm at the boundary after ``step``: ops of step ``step + 1`` on are recorded."""
        try:
            import torch

            self._tensor_type = torch.Tensor
            self._mode = _make_mode_class()(self)
            self._mode.__enter__()
        except Exception:  # noqa: BLE001
            self._mode = None
            return False
        self.active = True
        self.first_step = self.step = step + 1
        return True

    def boundary(self, completed_step: int) -> None:
        """A step ended: measure graph sizes, and ops from now on belong to the next step."""
        self.graph_sizes.append(self._graph_sizes())
        self.step = completed_step + 1

    def stop(self) -> None:
        if self._mode is not None and self.active:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass
        self.active = False

    def _aliasing(self, func: Any) -> tuple[bool, ...]:
        """Per return of ``func``: does it alias an input (view, in-place, out=)? Cached."""
        al = self._alias.get(func)
        if al is None:
            try:
                al = tuple(r.alias_info is not None for r in func._schema.returns)
            except Exception:  # noqa: BLE001
                al = ()
            self._alias[func] = al
        return al

    def _writes_in_place(self, func: Any) -> bool:
        """Does ``func`` return an input it wrote to (``add_``, ``out=``)? Cached."""
        w = self._writes.get(func)
        if w is None:
            try:
                r = func._schema.returns
                w = len(r) == 1 and r[0].alias_info is not None and bool(r[0].alias_info.is_write)
            except Exception:  # noqa: BLE001
                w = False
            self._writes[func] = w
        return w

    def _record_inplace(self, t: Any) -> None:
        """An in-place update of ``t``: its graph is measured at the boundaries (a running
        ``total_loss += loss`` keeps every step's graph without making a new tensor)."""
        key = id(t)
        old = self._inplace.get(key)
        if (old is not None and old[0]() is t) or len(self._inplace) >= self.MAX_INPLACE:
            return
        if t.is_leaf:  # parameters, buffers, gradients: no graph hangs off them
            return
        try:
            self._inplace[key] = (weakref.ref(t), user_frames_from_frame(sys._getframe(2)))
        except TypeError:
            pass

    def _record(self, func: Any, out: Any) -> None:
        al = self._aliasing(func)
        if isinstance(out, self._tensor_type) and al and al[0]:
            if self._writes_in_place(func):
                self._record_inplace(out)
            return
        if isinstance(out, (tuple, list)):
            if al and al[0] and len(al) == 1:  # Tensor[] of views (split, unbind)
                return
            for i, o in enumerate(out):
                if isinstance(o, self._tensor_type) and not (i < len(al) and al[i]):
                    self._record_one(o)
        elif isinstance(out, self._tensor_type) and not (al and al[0]):
            self._record_one(out)

    def _record_one(self, t: Any) -> None:
        if not self.skipped.check(t):
            return
        st = t.untyped_storage()
        n = st.nbytes()
        if n < self.min_bytes:
            return
        key = st.data_ptr()
        old = self._rec.get(key)
        if old is not None and old[0]() is st:
            return  # same storage (in-place op or view)
        if len(self._rec) >= self.MAX_RECORDS:
            return
        frames = user_frames_from_frame(sys._getframe(1))
        try:
            tref = weakref.ref(t)
        except TypeError:
            tref = None
        self._rec[key] = (weakref.ref(st), tref, n, self.step, frames, t.device.type == "cpu")

    def survivors(self, last_step: int) -> list[Survivor]:
        """Storages created before ``last_step`` (in the window) that are still alive."""
        out = []
        for sref, _tref, n, step, frames, _cpu in self._rec.values():
            if step < last_step and sref() is not None:
                out.append(Survivor(n, step, frames))
        return out

    def kept_cpu_bytes_by_step(self, last_step: int) -> dict[int, int]:
        """Step -> bytes of CPU storages made or first used in that step (before ``last_step``)
        still alive: a cache entry, a leak, the parameters first read in the window."""
        out: dict[int, int] = {}
        alive = [(r[3], r[2]) for r in list(self._rec.values()) if r[5] and r[0]() is not None]
        for step, n in alive + [(st, n) for ref, n, st in list(self._inputs.values()) if ref() is not None]:
            if step < last_step:
                out[step] = out.get(step, 0) + n
        return out

    def _record_inputs(self, args: Any) -> None:
        """CPU tensors an op reads that the window did not see made (a batch from a worker
        process, a tensor from before the window): counted in the live bytes from the step
        they are first used in."""
        for a in args:
            if isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, self._tensor_type):
                        self._record_input(b)
            elif isinstance(a, self._tensor_type):
                self._record_input(a)

    def _record_input(self, t: Any) -> None:
        if t.device.type != "cpu" or not self.skipped.check(t):
            return
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self._rec or len(self._inputs) >= self.MAX_RECORDS:
            return
        old = self._inputs.get(key)
        if old is not None and old[0]() is st:
            return
        self._inputs[key] = (weakref.ref(st), st.nbytes(), self.step)

    def live_cpu_bytes(self, step: int | None = None) -> int:
        """Bytes of CPU storages made or first used in the window (in ``step`` only, if
        given) that are still alive: the window's cheap view of live CPU tensors (no gc scan)."""
        made = sum(r[2] for r in list(self._rec.values())
                   if r[5] and (step is None or r[3] == step) and r[0]() is not None)
        used = sum(n for ref, n, st in list(self._inputs.values())
                   if (step is None or st == step) and ref() is not None)
        return made + used

    def _graph_sizes(self) -> dict[Any, int]:
        """Largest autograd graph reachable from a live tensor of each site (tensors with a
        grad_fn only; bounded walk)."""
        sizes: dict[Any, int] = {}
        budget = 50_000
        refs = [(r[1], r[4]) for r in list(self._rec.values())] + list(self._inplace.values())
        for tref, frames in refs:
            t = tref() if tref is not None else None
            gf = getattr(t, "grad_fn", None) if t is not None else None
            if gf is None or budget <= 0:
                continue
            n = graph_size(gf, cap=min(20000, budget))
            budget -= n
            key = frames[:1]
            if n > sizes.get(key, 0):
                sizes[key] = n
        return sizes

    def graph_growth(self) -> list[dict[str, Any]]:
        """Sites whose live graph grew at every boundary of the window (nodes per step)."""
        if len(self.graph_sizes) < 3:
            return []
        out = []
        # boundaries 0 is the window's first step end; compare the last ones only
        seq = self.graph_sizes[1:]
        for key in seq[-1]:
            vals = [g.get(key, 0) for g in seq]
            diffs = [b - a for a, b in zip(vals, vals[1:])]
            if diffs and min(diffs) > 0:
                frames = key
                out.append({"site": fmt_site(frames) if frames else "(no user frame)",
                            "function": frames[0][2] if frames else "",
                            "graph_nodes": vals[-1],
                            "nodes_per_step": round(sum(diffs) / len(diffs), 1)})
        out.sort(key=lambda d: -d["nodes_per_step"])
        return out[:5]


# ---- CUDA snapshot diff --------------------------------------------------------------------

def active_blocks(segments: list[dict[str, Any]]) -> dict[tuple, tuple[int, Frames]]:
    """{(address, size, user frames): (size, user frames)} of allocated blocks."""
    out = {}
    for seg in segments or ():
        for b in seg.get("blocks", ()):
            if b.get("state") != "active_allocated":
                continue
            frames = user_frames_from_snapshot(b.get("frames") or [])
            size = int(b.get("size", 0))
            out[(int(b.get("address", 0)), size, frames)] = (size, frames)
    return out


def survivors_from_snapshots(snaps: list[dict[tuple, tuple[int, Frames]]],
                             first_step: int) -> list[Survivor]:
    """Blocks allocated during the window (not in ``snaps[0]``), before its last step, and
    present at every later boundary. ``snaps[i]`` was taken after step ``first_step - 1 + i``.
    Blocks without a user frame are left out: allocations of autograd's device threads
    (gradients, re-made every step at the same address) look alike across snapshots and
    cannot be named anyway (seen on the H100: 12 such blocks in a healthy transformer)."""
    if len(snaps) < 3:
        return []
    k = len(snaps) - 1
    out = []
    for key, (size, frames) in snaps[-1].items():
        if not frames:
            continue
        j = k
        while j - 1 >= 0 and key in snaps[j - 1]:
            j -= 1
        if 1 <= j <= k - 1:
            out.append(Survivor(size, first_step - 1 + j, frames))
    return out


def sites_of_blocks(segments: list[dict[str, Any]], exclude: set[int] | None = None,
                    top: int = 5) -> list[dict[str, Any]]:
    """Live bytes of a snapshot grouped by innermost user frame (for the OOM report);
    blocks whose address is in ``exclude`` (parameters, gradients, optimizer state) are skipped."""
    by: dict[Any, list] = defaultdict(lambda: [0, 0, ()])
    for seg in segments or ():
        for b in seg.get("blocks", ()):
            if b.get("state") != "active_allocated":
                continue
            if exclude and int(b.get("address", 0)) in exclude:
                continue
            frames = user_frames_from_snapshot(b.get("frames") or [])
            rec = by[frames[:1]]
            rec[0] += int(b.get("size", 0))
            rec[1] += 1
            if len(frames) > len(rec[2]):
                rec[2] = frames
    out = [{"site": fmt_site(fr) if key else "(no user frame)", "bytes": n, "count": c,
            "called_from": [loc(f) for f in fr[1:]]}
           for key, (n, c, fr) in by.items()]
    out.sort(key=lambda d: -d["bytes"])
    return out[:top]
