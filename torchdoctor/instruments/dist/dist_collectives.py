"""The collective recorder: every ``torch.distributed`` call of a rank, in order (ranked runs only).

Armed for every probe, active only when the run was launched with ``--nproc-per-node``
(each rank runs this harness under torchrun). It wraps the public collectives of
``torch.distributed`` (both the ``torch.distributed.X`` and ``distributed_c10d.X`` names)
and appends one line per outermost call to ``collectives.jsonl`` in the rank's run dir,
*before* the call runs (so a call that never returns is on record)::

    {"seq": 7, "op": "all_reduce", "shapes": [[4]], "dtype": "float32",
     "site": "/abs/train.py:31", "fn": "main", "step": 3, "t": 12.5, "g": [0, 1]?, "async": 1?}

``seq`` counts calls per process group (``g``: the group's global ranks, absent for the
default group), ``step`` is the number of optimizer steps completed when it was called,
``site`` the innermost frame of the user's code, ``t`` ``time.monotonic()`` (one clock
for every process of the host). Calls made by torch itself inside a wrapped call (e.g.
``all_gather`` inside ``all_gather_object``) are not recorded separately; collectives
issued from C++ (DDP's gradient buckets) are not seen here: the flight recorder has them.

Cost: one frame walk, one short JSON line and one ``write`` (line-buffered) per call,
≈ 10 µs; the time spent inside each call is summed (``wait_s``: the per-rank step clock
reports it per step); a file holds at most ``ROTATE_LINES`` lines, then becomes
``collectives.1.jsonl`` (the previous chunk is dropped), so the last 50k-100k calls are kept.

At the parent's request (``dump.request`` in the run dir, at the timeout) a watcher thread
writes the flight recorder of this process (``torch._C._distributed_c10d._dump_fr_trace_json``
or ``_dump_nccl_trace_json``, whichever holds entries) to ``fr_trace.json``, then
``dump.done``. The thread polls every 0.2 s and runs while the main thread waits in a
collective or a CUDA synchronisation (both release the GIL).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any

from torchdoctor.distributed.rankdir import (COLLECTIVES, COLLECTIVES_OLD, DUMP_DONE, DUMP_REQUEST,
                                      FR_TRACE)
from torchdoctor.instruments.base import Instrument, register

OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
       "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
       "reduce", "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "gather",
       "gather_object", "scatter", "scatter_object_list", "send", "recv", "isend", "irecv",
       "batch_isend_irecv", "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base",
       "_reduce_scatter_base", "new_group")
FR_DUMPERS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")  # generic (gloo too), NCCL
ROTATE_LINES = 50_000
CURRENT: "_Recorder | None" = None  # the active recorder of this process (ranked runs)
MAX_SHAPES = 8
POLL_S = 0.2


def _shape_of(x: Any, torch: Any) -> list[int] | None:
    if isinstance(x, torch.Tensor):
        return list(x.shape)
    return None


class _Recorder:
    """The wrappers' shared state (one per process)."""

    def __init__(self, ctx: Any, torch: Any, dist: Any):
        self.ctx, self.torch, self.dist = ctx, torch, dist
        self.path = ctx.run_dir / COLLECTIVES
        self.f = open(self.path, "a", buffering=1, encoding="utf-8")
        self.lines = 0
        self.seq: dict[Any, int] = {}
        self.counts: dict[str, int] = {}
        self.groups: dict[int, list[int] | None] = {}
        self.local = threading.local()
        self.wait_s = 0.0  # time spent inside blocking calls (read per step by dist_steps)
        self.pid = os.getpid()
        self.failed = False
        from torchdoctor.runner.frames import is_user_file

        self.is_user_file = is_user_file

    # ---------------------------------------------------------------- one call
    def record(self, op: str, args: tuple, kwargs: dict) -> None:
        torch = self.torch
        shapes: list[Any] = []
        dtype = None
        group = kwargs.get("group")
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                shapes.append(list(a.shape))
                dtype = dtype or a.dtype
            elif isinstance(a, (list, tuple)) and a and len(shapes) < MAX_SHAPES:
                for t in a[:MAX_SHAPES]:
                    if isinstance(t, torch.Tensor):
                        shapes.append(list(t.shape))
                        dtype = dtype or t.dtype
            elif group is None and isinstance(a, self.dist.ProcessGroup):
                group = a
        gkey = self._group_key(group)
        self.seq[gkey] = n = self.seq.get(gkey, 0) + 1
        self.counts[op] = self.counts.get(op, 0) + 1
        rec: dict[str, Any] = {"seq": n, "op": op, "shapes": shapes[:MAX_SHAPES],
                               "dtype": str(dtype).replace("torch.", "") if dtype else None}
        f = sys._getframe(2)
        while f is not None and not self.is_user_file(f.f_code.co_filename):
            f = f.f_back
        if f is not None:
            rec["site"] = f"{f.f_code.co_filename}:{f.f_lineno}"
            rec["fn"] = f.f_code.co_name
        rec["step"] = self.ctx.step
        rec["t"] = round(time.monotonic(), 6)
        if gkey is not None:
            rec["g"] = list(gkey)
        if kwargs.get("async_op"):
            rec["async"] = 1
        for k in ("src", "dst", "group_src", "group_dst"):
            if kwargs.get(k) is not None:
                rec[k] = kwargs[k]
        self._write(json.dumps(rec, separators=(",", ":")))

    def _group_key(self, group: Any) -> tuple[int, ...] | None:
        if group is None:
            return None
        key = self.groups.get(id(group), False)
        if key is False:
            try:
                ranks = self.dist.get_process_group_ranks(group)
                world = self.dist.get_world_size()
                key = None if len(ranks) == world else tuple(ranks)
            except Exception:  # noqa: BLE001 - not a group we can name
                key = ("?",)
            self.groups[id(group)] = key
        return key

    def _write(self, line: str) -> None:
        if self.lines >= ROTATE_LINES:
            self.f.close()
            os.replace(self.path, self.path.with_name(COLLECTIVES_OLD))
            self.f = open(self.path, "a", buffering=1, encoding="utf-8")
            self.lines = 0
        self.f.write(line + "\n")
        self.lines += 1

    # ---------------------------------------------------------------- wrappers
    def wrap(self, op: str, orig: Any) -> Any:
        rec = self

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            local = rec.local
            if getattr(local, "depth", 0) or os.getpid() != rec.pid:
                return orig(*args, **kwargs)
            local.depth = 1
            t0 = time.perf_counter()
            try:
                try:
                    rec.record(op, args, kwargs)
                except Exception:  # noqa: BLE001 - never break the user's collective
                    rec.failed = True
                return orig(*args, **kwargs)
            finally:
                local.depth = 0
                rec.wait_s += time.perf_counter() - t0

        wrapper.__wrapped__ = orig
        wrapper._td_collective = op
        return wrapper

    def close(self) -> None:
        try:
            self.f.close()
        except Exception:  # noqa: BLE001
            pass


def dump_flight_recorder(run_dir: Any) -> dict[str, Any]:
    """Write this process's flight recorder to ``fr_trace.json``; what happened, as a dict.

    Every dump API present is tried and the one with the most entries is kept: on torch 2.11
    the generic ``_dump_fr_trace_json`` answered with no entries under NCCL while
    ``_dump_nccl_trace_json`` held them (2×H200); on torch 2.13 (CPU) only the generic one
    exists and it records gloo collectives.
    """
    out: dict[str, Any] = {"available": False}
    try:
        from torchdoctor.torch_internals import c10d_private

        c10d_c = c10d_private()
    except Exception as e:  # noqa: BLE001
        out["reason"] = f"{type(e).__name__}: {e}"
        return out
    best: tuple[int, str, bytes] | None = None
    reasons = []
    for name in FR_DUMPERS:
        fn = getattr(c10d_c, name, None)
        if fn is None:
            continue
        try:
            data = fn()
            data = data if isinstance(data, bytes) else str(data).encode()
            n = len(json.loads(data).get("entries") or [])
        except Exception as e:  # noqa: BLE001 - e.g. no NCCL process group in this build
            reasons.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if best is None or n > best[0]:
            best = (n, name, data)
    if best is None:
        out["reason"] = "; ".join(reasons) or "this torch has no flight recorder dump API"
        return out
    (run_dir / FR_TRACE).write_bytes(best[2])
    out.update(available=True, api=best[1], entries=best[0], bytes=len(best[2]))
    return out


@register
class CollectiveRecorder(Instrument):
    name = "dist_collectives"
    # inert unless the run is ranked; "collective" and "fr_entries" are its files, which the
    # parent merges into events (evidence/ranks.py)
    produces = frozenset({"collectives", "dist_init", "collective", "fr_entries"})
    priority = 15

    def install(self, ctx: Any) -> None:
        from torchdoctor.runner.patching import Patches

        self.rec: _Recorder | None = None
        self.undo = Patches()
        self.stop = threading.Event()
        if not ctx.options.get("nproc_per_node"):
            return
        import torch
        import torch.distributed as dist

        if not dist.is_available():
            ctx.emit("collectives", available=False, reason="torch.distributed is not available")
            return
        from torch.distributed import distributed_c10d as c10d

        self.rec = rec = _Recorder(ctx, torch, dist)
        global CURRENT
        CURRENT = rec
        for op in OPS:
            orig = getattr(c10d, op, None)
            if orig is None or getattr(orig, "_td_collective", None):
                continue
            w = rec.wrap(op, orig)
            for mod in (c10d, dist):
                if getattr(mod, op, None) is orig:
                    self.undo.set(mod, op, w, orig)
        self._wrap_init(ctx, dist, c10d)
        t = threading.Thread(target=self._watch, args=(ctx,), name="torchdoctor-dist-watch",
                             daemon=True)
        t.start()

    def _wrap_init(self, ctx: Any, dist: Any, c10d: Any) -> None:
        orig = c10d.init_process_group

        @functools.wraps(orig)
        def init_process_group(*args, **kwargs):
            out = orig(*args, **kwargs)
            try:
                if ctx.in_owner_process():
                    ctx.emit("dist_init", backend=str(dist.get_backend()), rank=dist.get_rank(),
                             world_size=dist.get_world_size(), step=ctx.step)
            except Exception:  # noqa: BLE001
                pass
            return out

        init_process_group.__wrapped__ = orig
        for mod in (c10d, dist):
            if getattr(mod, "init_process_group", None) is orig:
                self.undo.set(mod, "init_process_group", init_process_group, orig)

    def _watch(self, ctx: Any) -> None:
        req = ctx.run_dir / DUMP_REQUEST
        while not self.stop.wait(POLL_S):
            if req.exists():
                info = dump_flight_recorder(ctx.run_dir)
                try:
                    (ctx.run_dir / DUMP_DONE).write_text(json.dumps(info))
                except OSError:
                    pass
                return

    def uninstall(self, ctx: Any) -> None:
        self.stop.set()
        if getattr(self, "undo", None) is not None:
            self.undo.undo()
        rec = self.rec
        if rec is None:
            return
        global CURRENT
        CURRENT = None
        rec.close()
        ctx.emit("collectives", available=True, calls=sum(rec.counts.values()),
                 by_op=dict(sorted(rec.counts.items())), record_failed=rec.failed)
