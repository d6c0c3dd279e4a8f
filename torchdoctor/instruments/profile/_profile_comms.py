"""The collectives of one profiler window (ranked runs): time per kind, exposed vs overlapped,
bytes and bus bandwidth, per step. Pure Python over a flat (``_profiler_compat``): no torch.

Where a collective's time comes from:

* **device** (CUDA, NCCL): the NCCL kernels (``ncclDevKernel_AllGather_RING_LL``, ...) launched in
  the recorded steps. *Exposed* = the part of their union during which no other device work
  (compute kernels, copies, memsets, on any stream) ran: the time the GPU spent only
  communicating. *Overlapped* = the rest.
* **host** (gloo on CPU): gloo runs each collective on one of its worker threads (the profiler's
  ``gloo:all_gather`` ranges); the training thread waits for it in ``work.wait()``. *Exposed* = the
  part of the workers' union during which the training thread ran no torch op (it waited, or ran
  Python); *overlapped* = the part during which it ran torch ops (FSDP2's copy-in/out, the next
  block's compute). On CPU both compete for the same cores, so overlap here is not the free
  overlap of a GPU's copy engines and separate streams: the table says ``basis: "host"`` and the
  rules do not judge it.

Each device kernel / gloo range is paired with the host op that issued it (``c10d::_allgather_base_``,
``_c10d_functional::reduce_scatter_tensor``, ...): the kernel by its launch correlation, a gloo
range by order (the oldest unpaired compatible host op that started before it). The host op gives
the kind (gloo runs FSDP2's reduce-scatter as ``gloo:all_reduce``), the bytes and the step.

Bytes are the collective's size as nccl-tests counts it (all-gather: the gathered output;
reduce-scatter: the full input; all-reduce, broadcast, all-to-all: the tensor); bus bandwidth =
bytes / time × the ring factor (all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all
(n−1)/n; broadcast 1), n = the group's size (all-gather: output / input elements; reduce-scatter:
input / output; otherwise the world size).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdoctor.instruments.profile._profile_flat import ITEMSIZE, Window, _is_annotation, _ms, _union

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "other")
_KEYWORDS = (("reduce_scatter", "reduce_scatter"), ("reducescatter", "reduce_scatter"),
             ("allgather", "all_gather"), ("all_gather", "all_gather"),
             ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
             ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"), ("sendrecv", "all_to_all"),
             ("broadcast", "broadcast"))
HOST_PREFIX = ("c10d::", "_c10d_functional::", "c10d_functional::")
MAX_OPS = 4
NOT_COLLECTIVE = ("wait", "barrier", "monitored_barrier", "send", "recv", "recv_any_source")


def kind_of(name: str) -> str:
    low = name.lower().replace("nccldevkernel_", "").replace("ncclkernel_", "")
    for key, kind in _KEYWORDS:
        if key in low:
            return kind
    return "other"


def is_host_collective(name: str) -> bool:
    """A c10d op that issues a collective (not a wait, barrier or point-to-point op)."""
    if not name.startswith(HOST_PREFIX):
        return False
    base = name.split("::", 1)[1].rstrip("_")
    return not any(base == w or base.startswith(w + "_") for w in NOT_COLLECTIVE) and base != "wait_tensor"


def is_nccl_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


def bus_factor(kind: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind == "broadcast":
        return 1.0
    return (n - 1) / n


def _numel_bytes(spec: Any) -> tuple[int, int] | None:
    if not spec or not isinstance(spec, (list, tuple)) or len(spec) < 2:
        return None
    size = ITEMSIZE.get(str(spec[0]).lower())
    try:
        numel = int(spec[1])
    except (TypeError, ValueError):
        return None
    return (numel, numel * size) if size else None


def size_of(node: list, world: int) -> tuple[int | None, int]:
    """(bytes as nccl-tests counts them, group size) of a host collective op."""
    name, extra = node[3], node[7]
    kind = kind_of(name)
    ins = extra.get("in") or []
    functional = not name.startswith("c10d::")
    # c10d ops: (output, input, ...) for _allgather_base_/_reduce_scatter_base_; a tensor list first
    # for allreduce_/broadcast_/alltoall_ (the flat's "comm": [dtype, numel] of that list).
    # functional ops: (input, ...) and return a new tensor
    first = _numel_bytes(ins[0]) if ins else None
    second = _numel_bytes(ins[1]) if len(ins) > 1 else None
    listed = _numel_bytes(extra.get("comm"))
    if kind == "all_gather":
        if functional:
            return (first[1] * world if first else None), world
        if first and second and second[0]:
            return first[1], max(1, first[0] // second[0])
        return (first[1] if first else None), world
    if kind == "reduce_scatter":
        if functional:
            return (first[1] if first else None), world
        if first and second and first[0]:
            return second[1], max(1, second[0] // first[0])
        return (second[1] if second else None), world
    spec = first or listed
    return (spec[1] if spec else None), world


def _minus(intervals: list[tuple[int, int]], cover: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``intervals`` (merged) not inside the union of ``cover``."""
    merged = _merge(intervals)
    cov = _merge(cover)
    out: list[tuple[int, int]] = []
    j = 0
    for s, e in merged:
        cur = s
        while j < len(cov) and cov[j][1] <= cur:
            j += 1
        k = j
        while k < len(cov) and cov[k][0] < e:
            cs, ce = cov[k]
            if cs > cur:
                out.append((cur, cs))
            cur = max(cur, ce)
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _host_ops(w: Window) -> list[list]:
    return [n for n in w.nodes if n[2] == "op" and is_host_collective(n[3])]


def _issuer(w: Window, link: int) -> list | None:
    """The host collective op that launched a kernel (itself or an ancestor of the linked op)."""
    idx = w.by_corr.get(link)
    if idx is None:
        return None
    node = w.nodes[idx]
    if is_host_collective(node[3]):
        return node
    return next((a for a in w.ancestors(idx) if a[2] == "op" and is_host_collective(a[3])), None)


def _device_comms(w: Window) -> tuple[list[dict], list[tuple[int, int]]]:
    """NCCL kernels issued in the recorded steps (by their host op's start; a kernel Kineto did
    not link to an op, by its own start), and the other device work launched in them."""
    comms = []
    compute = [(d[2], d[3]) for d in w.device if not (d[1] == "kernel" and is_nccl_kernel(d[0]))]
    lo, hi = w.steps[0][1], w.steps[-1][2]
    for d in w.flat.get("device", []):
        if d[1] != "kernel" or not is_nccl_kernel(d[0]):
            continue
        op = _issuer(w, d[5]) if d[5] else None
        at = op[5] if op is not None else (w.nodes[w.by_corr[d[5]]][5] if d[5] in w.by_corr else None)
        if not lo <= (at if at is not None else d[2]) < hi:
            continue
        comms.append({"s": d[2], "e": d[3], "op": op,
                      "kind": kind_of(op[3]) if op is not None else kind_of(d[0]), "at": at})
    return comms, compute


def _host_comms(w: Window) -> tuple[list[dict], list[tuple[int, int]]]:
    main = w.main_tid
    hosts = sorted((n for n in _host_ops(w) if n[4] == main), key=lambda n: n[5])
    workers = sorted((n for n in w.nodes if n[2] == "op" and n[4] != main and n[3].startswith("gloo:")),
                     key=lambda n: n[5])
    used = [False] * len(hosts)
    comms = []
    for g in workers:
        gk = kind_of(g[3])
        ok = {gk, "reduce_scatter"} if gk == "all_reduce" else {gk}
        op = None
        for i, h in enumerate(hosts):
            if h[5] > g[5]:
                break
            if not used[i] and kind_of(h[3]) in ok:
                used[i], op = True, h
                break
        comms.append({"s": g[5], "e": g[6], "op": op, "kind": kind_of(op[3]) if op is not None else gk,
                      "at": op[5] if op is not None else g[5]})
    compute = [(n[5], n[6]) for n in w.nodes
               if n[2] == "op" and n[4] == main and not n[3].startswith(HOST_PREFIX)
               and not _is_annotation(n) and not n[3].startswith("ProfilerStep#")]
    return comms, compute


def collectives(w: Window, world: int, device: bool) -> dict[str, Any] | None:
    """The collectives table of one window (ms per recorded step), None without any collective."""
    if not w.steps:
        return None
    comms, compute = _device_comms(w) if device else _host_comms(w)
    if not comms:
        return None
    lo, hi = w.steps[0][1], w.steps[-1][2]
    if not device:  # host ranges: only those issued inside the recorded steps
        comms = [c for c in comms if lo <= c["at"] < hi]
    if not comms:
        return None
    n_steps = w.n_steps
    kinds: dict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "ns": 0, "exposed_ns": 0,
                                                             "bytes": 0, "bw_bytes": 0, "bw_ns": 0,
                                                             "ops": set()})
    cov = _merge(compute)
    for c in comms:
        iv = [(c["s"], c["e"])]
        k = kinds[c["kind"]]
        k["calls"] += 1
        k["ns"] += c["e"] - c["s"]
        k["exposed_ns"] += _length(_minus(iv, cov))
        if c["op"] is not None:
            k["ops"].add(c["op"][3])
            nbytes, n = size_of(c["op"], world)
            if nbytes:
                k["bytes"] += nbytes
                if c["e"] > c["s"] and c["kind"] != "other":  # gather/scatter/reduce: no bus factor
                    k["bw_bytes"] += nbytes * bus_factor(c["kind"], n)
                    k["bw_ns"] += c["e"] - c["s"]
    table = {}
    for kind in KINDS:
        if kind not in kinds:
            continue
        k = kinds[kind]
        row = {"calls_per_step": round(k["calls"] / n_steps, 2), "ms": _ms(k["ns"] / n_steps),
               "exposed_ms": _ms(k["exposed_ns"] / n_steps),
               "overlapped_ms": _ms((k["ns"] - k["exposed_ns"]) / n_steps)}
        if k["bytes"]:
            row["bytes_per_step"] = int(k["bytes"] / n_steps)
        if k["ops"]:
            row["ops"] = sorted(k["ops"])[:MAX_OPS]  # the host ops that issued them: who (FSDP2, DDP, DTensor)
        if k["bw_ns"]:
            row["busbw_gbs"] = float(f"{k['bw_bytes'] / k['bw_ns']:.4g}")  # bytes per ns = GB/s
        table[kind] = row
    all_iv = [(c["s"], c["e"]) for c in comms]
    busy = _length(_merge(all_iv))
    exposed = _length(_minus(all_iv, cov))
    step_ns = sum(e - s for _n, s, e in w.steps) / n_steps
    per_step = []
    for i, (num, s, e) in enumerate(w.steps):
        mine = [(c["s"], c["e"]) for c in comms if (c["at"] if c["at"] is not None else c["s"]) >= s
                and (c["at"] if c["at"] is not None else c["s"]) < e]
        per_step.append({"step": num + 1, "ms": _ms(_length(_merge(mine))),
                         "exposed_ms": _ms(_length(_minus(mine, cov))), "step_ms": _ms(e - s)})
    return {"basis": "device" if device else "host", "world": world, "steps": n_steps,
            "step_ms": _ms(step_ns), "kinds": table,
            "total": {"ms": _ms(busy / n_steps), "exposed_ms": _ms(exposed / n_steps),
                      "overlapped_ms": _ms((busy - exposed) / n_steps),
                      "exposed_share": round(exposed / n_steps / step_ns, 4) if step_ns else None},
            "per_step": per_step,
            "unpaired": sum(1 for c in comms if c["op"] is None)}
