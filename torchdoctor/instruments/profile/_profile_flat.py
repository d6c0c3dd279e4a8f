"""The data model of one profiler window, for :mod:`torchdoctor.instruments.profile._profile_analysis`:
a "flat" (see ``_profiler_compat``) indexed as a :class:`Window` (events, their nesting, the
active steps), :class:`Sources` (the user's files vs libraries) and the user's :class:`Site`
of an event. Pure Python over plain data: no torch, no GPU.
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
        # a partial window (the run ended inside it): its last range was closed by the
        # profiler's stop at teardown, not by a step end, so it holds no complete step but
        # whatever followed the last one (checkpoint save, destroy_process_group, exit): not
        # per-step work, so not a step of the window
        self.open_step_dropped = bool(self.flat.get("last_step_open") and self.steps)
        self.cut_ns: int | None = None  # host time from which nothing belongs to a step
        if self.open_step_dropped:
            self.cut_ns = self.steps[-1][1]
            self.steps = self.steps[:-1]
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

    def span_of(self, node: list) -> tuple[int, int] | None:
        """A node's host interval within the steps' time: cut at the dropped open range of a
        partial window (None when the node starts there: teardown, not step work)."""
        if self.cut_ns is None:
            return node[5], node[6]
        if node[5] >= self.cut_ns:
            return None
        return node[5], min(node[6], self.cut_ns)

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
