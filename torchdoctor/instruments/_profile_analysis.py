"""Analysis of one profiler window: a "flat" (see ``_profiler_compat``) → compact evidence.

Pure Python over plain data: no torch, no GPU. The profiler-window instrument calls
:func:`analyze` in the child right after the window and emits each payload as one evidence
event; tests call it on saved or synthetic flats.

Units: every duration in the payloads is in milliseconds per *active step* unless the key
says otherwise (``_us`` = microseconds, ``_ms`` = milliseconds, ``bytes``). "Step" = the time
between two optimizer steps (the ``ProfilerStep#N`` ranges of the trace).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

# CUDA runtime/driver calls that block the host until the device (or a stream/event) is done.
# (the synchronous cudaMemcpy family blocks too; cudaMemcpyAsync does not match.)
SYNC_CALL = re.compile(r"^cu(da)?(StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize|"
                       r"Memcpy|Memcpy2D|Memcpy3D|MemcpyDtoH|MemcpyHtoD|MemcpyDtoD)(_v\d+|_ptsz|_ptds)?$")
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
                      "aten::_addmm_activation", "aten::addmv", "aten::mv", "aten::dot",
                      "aten::_scaled_mm", "aten::_int_mm"})
CONV_PREFIX = ("aten::cudnn_convolution", "aten::convolution_backward", "aten::_convolution",
               "aten::miopen_convolution", "aten::mkldnn_convolution", "aten::_slow_conv2d",
               "aten::slow_conv", "aten::_conv_depthwise2d", "aten::conv_depthwise3d")
ITEMSIZE = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2,
            "bfloat16": 2, "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "int8": 1,
            "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
            "float8_e5m2": 1}
PY_NAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<func>.*)$")
TOP_N = 10
DEF_SCAN_LINES = 5000  # how far up from the running line a function's def is looked for


# --------------------------------------------------------------------------- source files

@dataclass
class Sources:
    """How to tell the user's files from library files, and how to show them.

    ``is_user(name)``: True for the user's code (not torch, not torchdoctor, not the standard
    library or site-packages); ``show(name)``: a short display path; ``code(name, line)``: the
    source line text or "". ``name`` is a file name as the Python tracer records it.
    """

    is_user: Callable[[str], bool]
    show: Callable[[str], str] = lambda f: f
    code: Callable[[str, int], str] = lambda f, n: ""
    is_tool: Callable[[str], bool] = lambda f: "torchdoctor" in f.replace("\\", "/").split("/")

    def def_line(self, name: str, line: int, func: str) -> int:
        """The line where ``func`` is defined (its code object's ``co_firstlineno``).

        The tracer names a Python call ``file(line): func`` with the line its frame was at when
        first seen: the ``def`` line for a call made inside the window, but the line *then
        running* for a frame already on the stack when the window opened (the training loop's
        function, the script's ``<module>``). The definition is found by walking up the source
        from that line to the nearest ``def func`` (a decorator above it is part of the
        definition, as in ``co_firstlineno``); ``<module>`` is defined at line 1.
        """
        if func == "<module>":
            return 1
        if not line or not func or not func.isidentifier():
            return line
        pat = re.compile(r"^\s*(async\s+)?def\s+" + re.escape(func) + r"\s*[(\[]")
        for n in range(line, max(0, line - DEF_SCAN_LINES), -1):
            text = self.code(name, n)
            if pat.match(text):
                while n > 1 and self.code(name, n - 1).lstrip().startswith("@"):
                    n -= 1
                return n
        return line


# --------------------------------------------------------------------------- the window

@dataclass
class Window:
    """Indexes over a flat, built once."""

    flat: dict[str, Any]
    nodes: list = field(init=False)
    parent: list = field(init=False)
    by_corr: dict = field(init=False)
    steps: list = field(init=False)  # [(number, start_ns, end_ns)]
    main_tid: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = self.flat.get("nodes", [])
        self.parent = [n[1] for n in self.nodes]
        self.by_corr = {}
        steps = []
        tids: dict[int, int] = defaultdict(int)
        annotations: set[str] = set()
        for n in self.nodes:
            if n[2] == "op":
                c = n[7].get("corr")
                if c:
                    self.by_corr[c] = n[0]
                if _is_annotation(n):
                    annotations.add(n[3])
                if n[3].startswith("ProfilerStep#"):
                    try:
                        steps.append((int(n[3].split("#", 1)[1]), n[5], n[6], self._ours(n)))
                    except ValueError:
                        pass
                    tids[n[4]] += 1
        # a script that runs its own torch.profiler adds its own ProfilerStep#N ranges: keep ours
        # (opened from the window instrument) when they can be told apart, one range per N
        by_n: dict[int, tuple] = {}
        for st in sorted(steps, key=lambda x: (x[0], not x[3], x[1])):
            by_n.setdefault(st[0], st)
        self.steps = sorted((n, s, e) for n, s, e, _ours in by_n.values())
        self.main_tid = max(tids, key=tids.get) if tids else None
        self._py_index: list | None = None
        # device activity: kernels, copies and memsets only. The GPU-side mirrors of
        # record_function ranges ("ProfilerStep#6", "Optimizer.step#SGD.step") are dropped:
        # torch builds without ``activity_type()`` report them as plain device events.
        work = [d for d in self.flat.get("device", [])
                if d[1] in ("kernel", "memcpy", "memset")
                and d[0] not in annotations and not d[0].startswith("ProfilerStep#")]
        # ... and only the work *launched* in the recorded steps: when the host runs ahead of a
        # busy GPU, kernels queued during the warm-up step still execute inside the window
        # (measured: +22% of GPU time on the H100 float32 fixture). They carry no link to a
        # recorded op. Builds that link nothing keep everything.
        launched = [d for d in work if d[5] in self.by_corr
                    and self.step_index(self.nodes[self.by_corr[d[5]]][5]) is not None]
        self.device = launched if launched or not work else work
        self.device_unlaunched = len(work) - len(self.device)

    def _ours(self, node: list) -> bool:
        """True if a ProfilerStep range was opened by torchdoctor's window instrument."""
        p = node[1]
        for _ in range(12):
            if p is None or p < 0:
                return False
            a = self.nodes[p]
            if a[2] in ("py", "pyc") and str(a[7].get("file", "")).endswith("profiler_window.py"):
                return True
            p = a[1]
        return False

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def span_ns(self) -> int:
        return (self.steps[-1][2] - self.steps[0][1]) if self.steps else 0

    def step_index(self, t: int) -> int | None:
        for i, (_n, s, e) in enumerate(self.steps):
            if s <= t < e:
                return i
        return None

    def ancestors(self, idx: int) -> Iterable[list]:
        p = self.parent[idx]
        while p is not None and p >= 0:
            yield self.nodes[p]
            p = self.parent[p]

    def enclosing(self, t: int) -> int | None:
        """Innermost Python/op node of the main thread that contains time ``t`` (index)."""
        import bisect

        if self._py_index is None:
            cand = [n for n in self.nodes if n[2] in ("py", "pyc", "op") and n[4] == self.main_tid]
            cand.sort(key=lambda n: n[5])
            self._py_index = ([n[5] for n in cand], cand)
        starts, cand = self._py_index
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return None
        idx = cand[i][0]
        while idx is not None and idx >= 0:
            n = self.nodes[idx]
            if n[5] <= t <= n[6]:
                return idx
            idx = self.parent[idx]
        return None


def _is_annotation(node: list) -> bool:
    """A record_function range (ProfilerStep#, Optimizer.step#..., enumerate(DataLoader)#...)."""
    u = node[7].get("user")
    if u is not None:
        return bool(u)
    name = node[3]
    return "#" in name and not name.startswith("aten::")


# --------------------------------------------------------------------------- call sites

@dataclass
class Site:
    file: str | None = None  # user file (display form)
    line: int | None = None
    func: str | None = None
    code: str = ""
    via: str | None = None  # innermost library frame "file:line" when the user frame is further out
    tool: bool = False  # torchdoctor's own code is on the stack
    lib_files: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}" if self.file else (self.via or "unknown")


def site_of(w: Window, idx: int, src: Sources) -> Site:
    """The user's call site (innermost user frame) of node ``idx``, walking up the tree.

    A Python node's own record counts: its ``file:line`` is where it was called from.
    """
    site = Site()
    libs = []
    chain = [w.nodes[idx], *w.ancestors(idx)] if idx is not None else []
    for n in chain:
        if n[2] not in ("py", "pyc"):
            continue
        f = n[7].get("file")
        if not f:
            continue
        if src.is_tool(f):
            site.tool = True
        if src.is_user(f):
            site.file, site.line, site.func = src.show(f), n[7].get("line"), n[7].get("func")
            site.code = src.code(f, n[7].get("line") or 0)
            break
        libs.append(f)
        if site.via is None:
            site.via = f"{f}:{n[7].get('line')}"
    site.lib_files = tuple(libs)
    return site


def _site_dict(site: Site) -> dict[str, Any]:
    d: dict[str, Any] = {"site": site.key}
    if site.func:
        d["func"] = site.func
    if site.code:
        d["code"] = site.code
    if site.via and site.file:
        d["via"] = site.via
    return d


# --------------------------------------------------------------------------- helpers

def _union(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _op_bytes(node: list, which: int = 1) -> int | None:
    ins = node[7].get("in") or []
    if len(ins) > which and ins[which]:
        dt, numel = ins[which]
        size = ITEMSIZE.get(str(dt).lower())
        if size:
            return int(numel) * size
    return None


def _is_conv(name: str) -> bool:
    return name.startswith(CONV_PREFIX)


# --------------------------------------------------------------------------- sections

def window_summary(w: Window) -> dict[str, Any]:
    """Which optimizer steps were recorded (1-based, as the step clock counts them).

    ``ProfilerStep#N`` opens when step N ends, so it covers step N + 1.
    """
    ms = [_ms(e - s) for _n, s, e in w.steps]
    return {"active_steps": w.n_steps, "steps": [n + 1 for n, _s, _e in w.steps],
            "profiled_step_ms": ms, "truncated": bool(w.flat.get("truncated"))}


def top_ops(w: Window) -> dict[str, Any]:
    """Torch ops by self CPU time, and by device time of the kernels they launched."""
    n = max(1, w.n_steps)
    child_ops = defaultdict(int)
    for node in w.nodes:
        if node[2] == "op" and node[1] >= 0 and w.nodes[node[1]][2] == "op":
            child_ops[node[1]] += node[6] - node[5]
    dev_by_corr = defaultdict(int)
    for d in w.device:
        if d[5]:
            dev_by_corr[d[5]] += d[3] - d[2]
    agg: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0])  # calls, self, total, device
    for node in w.nodes:
        if node[2] != "op" or _is_annotation(node):
            continue
        dur = node[6] - node[5]
        a = agg[node[3]]
        a[0] += 1
        a[1] += max(0, dur - child_ops.get(node[0], 0))
        a[2] += dur
        a[3] += dev_by_corr.get(node[7].get("corr"), 0)
    rows = [{"name": k, "calls": round(v[0] / n, 2), "self_cpu_ms": _ms(v[1] / n),
             "cpu_total_ms": _ms(v[2] / n), "device_ms": _ms(v[3] / n)} for k, v in agg.items()]
    by_cpu = sorted(rows, key=lambda r: -r["self_cpu_ms"])[:TOP_N]
    by_dev = [r for r in sorted(rows, key=lambda r: -r["device_ms"]) if r["device_ms"] > 0][:TOP_N]
    return {"by_self_cpu": by_cpu, "by_device": by_dev,
            "self_cpu_ms": _ms(sum(v[1] for v in agg.values()) / n)}


def top_kernels(w: Window) -> dict[str, Any]:
    n = max(1, w.n_steps)
    agg: dict[str, list] = defaultdict(lambda: [0, 0, ""])
    for d in w.device:
        a = agg[d[0]]
        a[0] += 1
        a[1] += d[3] - d[2]
        a[2] = d[1]
    rows = [{"name": (k if len(k) <= 120 else k[:117] + "..."), "kind": v[2],
             "calls": round(v[0] / n, 2), "device_ms": _ms(v[1] / n),
             "mean_us": round(v[1] / v[0] / 1e3, 2) if v[0] else 0.0} for k, v in agg.items()]
    rows.sort(key=lambda r: -r["device_ms"])
    return {"rows": rows[:TOP_N], "distinct": len(rows)}


def device_time(w: Window) -> dict[str, Any]:
    """GPU busy time (union of kernel/copy/memset intervals) and kernel statistics per step,
    over the device work launched by the recorded steps."""
    n = max(1, w.n_steps)
    dev = w.device
    kernels = [d[3] - d[2] for d in dev if d[1] == "kernel"]
    busy = _union([(d[2], d[3]) for d in dev])
    kernels.sort()
    return {"gpu_busy_ms": _ms(busy / n), "kernels_per_step": round(len(kernels) / n, 1),
            "kernel_ms": _ms(sum(kernels) / n),
            "median_kernel_us": round(kernels[len(kernels) // 2] / 1e3, 2) if kernels else 0.0,
            "device_events": len(dev), "not_launched_in_window": w.device_unlaunched}


def syncs(w: Window, src: Sources) -> dict[str, Any]:
    """Host-blocking CUDA calls per step, classified and attributed to the user's line.

    ``d2h``: waits for device results (``.item()``, ``.cpu()``, printing, ``torch.cuda.synchronize``).
    Not counted as d2h: the wait of a blocking host→device copy (``h2d_copy``: judged by the
    pageable-copy rule), GradScaler's own inf check (``grad_scaler``: by design), and calls made
    by torchdoctor itself (``tool``).
    """
    memcpy_dir: dict[int, set] = defaultdict(set)
    for d in w.device:
        if d[1] == "memcpy" and d[5]:
            memcpy_dir[d[5]].add("HtoD" if "HtoD" in d[0] else ("DtoH" if "DtoH" in d[0] else "other"))
    per_step = [0] * w.n_steps
    wait_ns = 0
    sites: dict[str, dict] = {}
    excluded: dict[str, int] = defaultdict(int)
    for r in w.flat.get("runtime", []):
        name, start, end, _corr, link = r[0], r[1], r[2], r[3], r[4]
        if not SYNC_CALL.match(name):
            continue
        i = w.step_index(start)
        if i is None:
            continue
        op_idx = w.by_corr.get(link) if link else None
        anchor = op_idx if op_idx is not None else w.enclosing(start)
        site = site_of(w, anchor, src) if anchor is not None else Site()
        op_name = w.nodes[op_idx][3] if op_idx is not None else None
        if site.tool:
            excluded["tool"] += 1
            continue
        if op_idx is not None and "HtoD" in memcpy_dir.get(link, ()) and "DtoH" not in memcpy_dir.get(link, ()):
            excluded["h2d_copy"] += 1
            continue
        if any("grad_scaler" in f for f in site.lib_files):
            excluded["grad_scaler"] += 1
            continue
        per_step[i] += 1
        wait_ns += end - start
        s = sites.setdefault(site.key, {**_site_dict(site), "count": 0, "wait_ns": 0, "calls": set(),
                                        "ops": set()})
        s["count"] += 1
        s["wait_ns"] += end - start
        s["calls"].add(name)
        if op_name:
            s["ops"].add(op_name)
    n = max(1, w.n_steps)
    rows = []
    for s in sorted(sites.values(), key=lambda s: -s["count"]):
        s["per_step"] = round(s.pop("count") / n, 2)
        s["wait_ms"] = _ms(s.pop("wait_ns") / n)
        s["calls"] = sorted(s["calls"])
        s["ops"] = sorted(s["ops"])
        rows.append(s)
    return {"per_step": per_step, "wait_ms": _ms(wait_ns / n), "sites": rows[:TOP_N],
            "excluded": dict(excluded)}


def copies(w: Window, src: Sources) -> dict[str, Any]:
    """Memcpy kinds, and pageable host→device copies per step with the user's line."""
    n = max(1, w.n_steps)
    kinds: dict[str, list] = defaultdict(lambda: [0, 0, 0])
    per_step = [0] * w.n_steps
    bytes_step = [0] * w.n_steps
    sites: dict[str, dict] = {}
    pageable_ns = 0
    for d in w.device:
        if d[1] != "memcpy":
            continue
        op_idx = w.by_corr.get(d[5]) if d[5] else None
        b = d[7] if d[7] is not None else (_op_bytes(w.nodes[op_idx]) if op_idx is not None else None)
        k = kinds[d[0]]
        k[0] += 1
        k[1] += b or 0
        k[2] += d[3] - d[2]
        if "HtoD" not in d[0] or "Pageable" not in d[0]:
            continue
        t = w.nodes[op_idx][5] if op_idx is not None else d[2]
        i = w.step_index(t)
        if i is None:
            continue
        site = site_of(w, op_idx, src) if op_idx is not None else Site()
        if site.tool:
            continue
        per_step[i] += 1
        bytes_step[i] += b or 0
        pageable_ns += d[3] - d[2]
        s = sites.setdefault(site.key, {**_site_dict(site), "count": 0, "bytes": 0})
        s["count"] += 1
        s["bytes"] += b or 0
    rows = sorted(sites.values(), key=lambda s: -s["bytes"])
    for s in rows:
        s["per_step"] = round(s.pop("count") / n, 2)
        s["bytes_per_step"] = int(s.pop("bytes") / n)
    kind_rows = [{"kind": k, "per_step": round(v[0] / n, 2), "bytes_per_step": int(v[1] / n),
                  "device_ms": _ms(v[2] / n)} for k, v in sorted(kinds.items())]
    return {"kinds": kind_rows, "pageable_h2d_per_step": per_step,
            "pageable_h2d_bytes_per_step": bytes_step, "pageable_h2d_ms": _ms(pageable_ns / n),
            "pageable_sites": rows[:TOP_N]}


def gemm(w: Window, src: Sources, flags: dict[str, Any]) -> dict[str, Any]:
    """Device time of matmul/conv kernels by input dtype; float32 without TF32 singled out."""
    n = max(1, w.n_steps)
    total = 0
    mm_conv = 0
    fp32_plain = 0
    by_dtype: dict[str, int] = defaultdict(int)
    ops: dict[tuple, list] = {}
    kernels: dict[str, int] = defaultdict(int)
    for d in w.device:
        if d[1] != "kernel":
            continue
        dur = d[3] - d[2]
        total += dur
        op_idx = w.by_corr.get(d[5]) if d[5] else None
        if op_idx is None:
            continue
        op = w.nodes[op_idx]
        name = op[3]
        conv = _is_conv(name)
        if name not in GEMM_OPS and not conv:
            continue
        mm_conv += dur
        ins = op[7].get("in") or []
        dtype = next((x[0] for x in ins if x), "unknown")
        by_dtype[dtype] += dur
        if dtype not in ("float32", "float"):
            continue
        if conv:
            tf32 = bool(flags.get("cudnn_allow_tf32", True))
        else:
            tf32 = op[7].get("tf32")
            if tf32 is None:
                tf32 = bool(flags.get("matmul_allow_tf32", False))
        if "tf32" in d[0].lower():
            tf32 = True
        if tf32:
            continue
        fp32_plain += dur
        kernels[d[0] if len(d[0]) <= 100 else d[0][:97] + "..."] += dur
        site = site_of(w, op_idx, src)
        k2 = (name, site.key)
        if k2 not in ops:
            ops[k2] = [0, 0, site]
        ops[k2][0] += 1
        ops[k2][1] += dur
    op_rows = []
    for (name, _k), (calls, dur, site) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:TOP_N]:
        op_rows.append({"op": name, **_site_dict(site), "calls": round(calls / n, 2),
                        "device_ms": _ms(dur / n)})
    return {"kernel_ms": _ms(total / n), "mm_conv_ms": _ms(mm_conv / n), "fp32_plain_ms": _ms(fp32_plain / n),
            "mm_conv_by_dtype_ms": {k: _ms(v / n) for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1])},
            "fp32_kernels": [{"name": k, "device_ms": _ms(v / n)}
                             for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:5]],
            "fp32_ops": op_rows}


def host(w: Window, src: Sources) -> dict[str, Any]:
    """Where the main thread's time goes within the profiled steps (CPU view), per step.

    ``ops_ms``: union of top-level torch op intervals (record_function ranges excluded, the ops
    inside them included); ``python_ms``: the rest of the step on the main thread. Medians over
    the active steps; ``ops_ms_min``: the least-disturbed step (preemption by a busy neighbour
    only ever adds time, so the minimum is the best estimate of the work itself).
    """
    import statistics

    if not w.steps:
        return {}
    per_step: list[list[tuple[int, int]]] = [[] for _ in w.steps]
    for node in w.nodes:
        if node[2] != "op" or node[4] != w.main_tid or _is_annotation(node):
            continue
        top = True
        for a in w.ancestors(node[0]):
            if a[2] == "op" and not _is_annotation(a):
                top = False
                break
        if not top:
            continue
        for i, (_n, s, e) in enumerate(w.steps):
            if node[6] > s and node[5] < e:
                per_step[i].append((max(s, node[5]), min(e, node[6])))
    ops = [_union(iv) for iv in per_step]
    spans = [e - s for _n, s, e in w.steps]
    rest = [max(0, sp - o) for sp, o in zip(spans, ops)]
    return {"profiled_step_ms": _ms(statistics.median(spans)), "ops_ms": _ms(statistics.median(ops)),
            "python_ms": _ms(statistics.median(rest)), "ops_ms_min": _ms(min(ops)),
            "ops_ms_per_step": [_ms(o) for o in ops]}


def python_hotspots(w: Window, src: Sources) -> dict[str, Any]:
    """User functions by self time (Python outside torch ops and calls), per step.

    ``in_data``: the function ran inside the DataLoader's ``__next__`` (a dataset or collate).
    """
    n = max(1, w.n_steps)
    child = defaultdict(int)
    for node in w.nodes:
        p = node[1]
        if p >= 0 and w.nodes[p][2] == "py":
            child[p] += node[6] - node[5]
    agg: dict[str, list] = {}
    # node name -> ("file:def line", func), None when not the user's; one source walk per name
    keys: dict[str, tuple[str, str] | None] = {}
    # in_data per node in one pass (depth-first order: a parent comes before its children), not
    # an ancestor walk per call: linear in the nodes however deep the Python stacks
    in_data = [False] * len(w.nodes)
    for node in w.nodes:
        p = node[1]
        if p >= 0:
            pn = w.nodes[p]
            in_data[node[0]] = in_data[p] or (pn[2] == "op" and pn[3].startswith("enumerate(DataLoader)"))
        if node[2] != "py":
            continue
        if node[3] not in keys:
            m = PY_NAME.match(node[3])
            keys[node[3]] = None
            if m and src.is_user(m.group("file")):
                line = src.def_line(m.group("file"), int(m.group("line")), m.group("func"))
                keys[node[3]] = (f"{src.show(m.group('file'))}:{line}", m.group("func"))
        hit = keys[node[3]]
        if hit is None:
            continue
        key, func = hit
        self_ns = max(0, node[6] - node[5] - child.get(node[0], 0))
        a = agg.setdefault(key, [func, 0, 0, False])
        a[1] += 1
        a[2] += self_ns
        a[3] = a[3] or in_data[node[0]]
    rows = [{"def": k, "func": v[0], "calls": round(v[1] / n, 2), "self_ms": _ms(v[2] / n),
             **({"in_data": True} if v[3] else {})} for k, v in agg.items()]
    rows.sort(key=lambda r: -r["self_ms"])
    return {"functions": rows[:TOP_N], "user_self_ms": _ms(sum(v[2] for v in agg.values()) / n)}


def analyze(flat: dict[str, Any], src: Sources, flags: dict[str, Any] | None = None) -> dict[str, dict]:
    """Every payload of one window, keyed by evidence kind. Device payloads only with GPU data."""
    w = Window(flat)
    flags = flags or {}
    out: dict[str, dict] = {"profile_window": window_summary(w)}
    if not w.steps:
        return out
    out["profile_ops"] = top_ops(w)
    out["profile_host"] = host(w, src)
    out["profile_python"] = python_hotspots(w, src)
    if w.device:
        out["profile_device"] = device_time(w)
        out["profile_kernels"] = top_kernels(w)
        out["profile_gemm"] = gemm(w, src, flags)
        out["profile_copies"] = copies(w, src)
    if flat.get("device") or flat.get("runtime"):
        out["profile_syncs"] = syncs(w, src)
    return out
