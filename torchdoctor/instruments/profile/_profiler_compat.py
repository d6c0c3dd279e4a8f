"""The one place that touches torch.profiler internals (feature-detected; torch 2.11 and 2.13).

Everything private (``prof.profiler.kineto_results``, the experimental event tree, the
``_ProfilerEvent`` / ``_KinetoEvent`` accessors) is read here and turned into *plain data* —
a "flat" dict of lists — that :mod:`torchdoctor.instruments.profile._profile_analysis` reads. The
analysis never sees a torch object, so it is unit-tested on saved flats without torch or a GPU.

Flat layout (all times in ns relative to the trace start; JSON-able)::

    {"version": 1, "torch": "2.11.0+cu130",
     "nodes":  [[id, parent, tag, name, tid, start, end, extra], ...],   # the event tree
     "device": [[name, kind, start, end, corr, link, stream, bytes], ...], # GPU activity
     "runtime": [[name, start, end, corr, link, tid], ...],             # CUDA runtime/driver calls
     "truncated": bool}

``nodes``: tree events in depth-first order; ``parent`` is the index of the parent node or -1;
``tag`` is "op" (torch op / record_function), "py" (Python call), "pyc" (Python C call) or
"k" (a Kineto activity placed in the tree); leaf "pyc" nodes (a C call that ran no torch op:
``min``, ``len``, ``list.append``) are not kept, only counted (``leaf_c_calls_dropped``). ``extra``: for "op" ``{"corr", "scope", "tf32",
"in": [[dtype, numel] | None, ...]}``, for "py"/"pyc" ``{"file", "line", "func"}`` of the *caller*
frame (the call site), for "k" ``{"corr"}``.
``device``: ``kind`` is "kernel", "memcpy", "memset" or "other"; ``link`` is the correlation id
of the torch op that launched it (0 when none); ``bytes`` is the transfer size when Kineto says.
``runtime``: host-side CUDA runtime/driver calls (cudaLaunchKernel, cudaStreamSynchronize, ...);
``link`` as above.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from typing import Any, Callable

from torchdoctor.instruments.profile._profiler_text import _dtype_name, _list_input, _op_inputs, _op_shapes, _text  # noqa: F401

FLAT_VERSION = 1
MAX_NODES = 400_000  # a pathological window (hundreds of thousands of Python calls) is cut, not analysed forever
MAX_NAME = 240  # templated kernel names run to kilobytes; the head tells them apart
# matmul ops whose input sizes are kept (M, N, K): [bias,] a, b
GEMM_SHAPED = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"})

# Kineto activity types: ``activity_type()`` returns the enum's int on some builds and its
# trace name on others (libkineto ActivityType.h: 3 gpu_memcpy, 4 gpu_memset, 5 kernel,
# 7 cuda_runtime, 8 cuda_driver).
_ACT_NAMES = {3: "gpu_memcpy", 4: "gpu_memset", 5: "kernel", 7: "cuda_runtime", 8: "cuda_driver"}
_RUNTIME_NAME = re.compile(r"^cu[A-Z_a-z]")
_KINETO_LINE = re.compile(r"(SyncActivityProfilerHandler|ActivityProfilerController|"
                          r"CuptiActivityProfiler|profiler_start|profiler_stop|libkineto|Kineto|"
                          r"DeviceProperties\.cpp.*gpuGetDeviceCount)",
                          re.I)


def unavailable_reason() -> str | None:
    """Why the kineto profiler cannot run here (None when it can)."""
    try:
        import torch
        import torch.profiler  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"torch.profiler unavailable: {type(e).__name__}: {e}"
    try:
        if not torch.autograd.kineto_available():
            return "this torch build has no Kineto profiler"
    except Exception:  # noqa: BLE001 - very old builds: let profile() decide
        pass
    return None


def cuda_wanted() -> bool:
    """True when CUDA activity should be recorded (a CUDA device is visible)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def make_schedule(wait: int, warmup: int, active: int) -> Callable[[int], Any]:
    import torch.profiler as tp

    return tp.schedule(wait=wait, warmup=warmup, active=active, repeat=1)


def set_window(prof: Any, wait: int, warmup: int, active: int, with_stack: bool) -> bool:
    """Re-plan a scheduled profiler that is still waiting (nothing prepared yet).

    ``with_stack`` and ``schedule`` are read when the warm-up begins (``prepare_trace`` builds
    the autograd profiler from ``self.with_stack``; ``step()`` asks ``self.schedule``), so
    changing them before that takes effect. False when this torch has neither attribute.
    """
    if not hasattr(prof, "with_stack") or not hasattr(prof, "schedule"):
        return False
    prof.with_stack = bool(with_stack)
    prof.schedule = make_schedule(wait, warmup, active)
    return True


def make_profiler(wait: int, warmup: int, active: int, cuda: bool,
                  on_ready: Callable[[Any], None]) -> Any:
    """A scheduled ``torch.profiler.profile`` (shapes + Python stacks), not started.

    One cycle only (``repeat=1``): ``wait`` steps of nothing, ``warmup`` steps armed but
    discarded, ``active`` steps recorded, then ``on_ready(prof)``.
    """
    import inspect

    import torch.profiler as tp

    acts = [tp.ProfilerActivity.CPU]
    if cuda:
        acts.append(tp.ProfilerActivity.CUDA)
    kw: dict[str, Any] = dict(activities=acts, record_shapes=True, with_stack=True,
                              profile_memory=False, on_trace_ready=on_ready,
                              schedule=make_schedule(wait, warmup, active))
    params = inspect.signature(tp.profile.__init__).parameters
    if "acc_events" in params:
        kw["acc_events"] = False
    return tp.profile(**kw)


class quiet_kineto:
    """Context manager: drop Kineto's ``profiler_start/stop`` lines that it prints on fd 2.

    Also silences torch.profiler's own "Profiler clears events at the end of each cycle"
    UserWarning (one cycle is all the window ever records).

    Kineto writes them from C++ straight to file descriptor 2 and its log-level variables do
    not silence them, so fd 2 is pointed at a temp file for the duration of a profiler call
    and every other line is replayed to the real stderr afterwards (nothing of the script's is
    lost). Only wraps profiler start/step/stop calls: microseconds when nothing is printed.
    """

    def __enter__(self):
        import warnings

        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.filterwarnings("ignore", message=".*[Pp]rofiler clears events.*")
        self._saved = None
        try:
            sys.stderr.flush()
            self._tmp = tempfile.TemporaryFile(mode="w+b")
            self._saved = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except OSError:
            self._saved = None
        return self

    def __exit__(self, *exc):
        self._warn.__exit__(*exc)
        if self._saved is None:
            return False
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os.dup2(self._saved, 2)
        os.close(self._saved)
        try:
            self._tmp.seek(0)
            data = self._tmp.read().decode("utf-8", "replace")
            self._tmp.close()
        except OSError:
            return False
        keep = [ln for ln in data.splitlines(keepends=True) if not _KINETO_LINE.search(ln)]
        if keep:
            try:
                sys.stderr.write("".join(keep))
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
        return False


def export_trace(prof: Any, path: str) -> None:
    """Write the Chrome/Perfetto trace of the last cycle (``.json`` or ``.json.gz``)."""
    with quiet_kineto():
        prof.export_chrome_trace(path)


def torch_flags() -> dict[str, Any]:
    """Global numerics flags that decide whether float32 GEMMs may use tensor cores."""
    out: dict[str, Any] = {}
    try:
        import torch

        out["matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        out["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except Exception:  # noqa: BLE001
        pass
    return out


def device_info() -> dict[str, Any]:
    """Name and compute capability of the current CUDA device ({} without CUDA)."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        i = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(i)
        return {"name": torch.cuda.get_device_name(i), "capability": [major, minor],
                "bf16": bool(torch.cuda.is_bf16_supported())}
    except Exception:  # noqa: BLE001
        return {}


# --------------------------------------------------------------------------- flattening

def _frame(fs: Any) -> dict[str, Any]:
    try:
        return {"file": _text(lambda: fs.file_name), "line": int(fs.line_number),
                "func": _text(lambda: fs.function_name)}
    except Exception:  # noqa: BLE001
        return {}


def _tree_nodes(res: Any, t0: int) -> tuple[list, bool, int]:
    from torch._C._profiler import _EventType

    tag_of = {_EventType.TorchOp: "op", _EventType.PyCall: "py", _EventType.PyCCall: "pyc"}
    kineto_tag = getattr(_EventType, "Kineto", None)
    user_scope = None
    try:
        from torch._C._profiler import RecordScope

        user_scope = RecordScope.USER_SCOPE
    except Exception:  # noqa: BLE001
        pass
    nodes: list = []
    truncated = False
    dropped = 0
    stack: list[tuple[Any, int]] = [(r, -1) for r in reversed(res.experimental_event_tree())]
    while stack:
        ev, parent = stack.pop()
        tag = tag_of.get(ev.tag)
        if tag is None and ev.tag == kineto_tag:
            tag = "k"
        if tag is None:
            continue  # allocations, backend events: not used
        if len(nodes) >= MAX_NODES:
            truncated = True
            break
        ef = ev.extra_fields
        if tag == "op":
            extra: dict[str, Any] = {"corr": int(ev.correlation_id), "in": _op_inputs(ef)}
            name = _text(lambda: ev.name)
            if name in GEMM_SHAPED:  # their M, N, K: gemm-unaligned (_profile_gemm.py)
                extra["shapes"] = _op_shapes(ef)
            if name.startswith("c10d::"):
                comm = _list_input(ef)  # allreduce_/broadcast_/alltoall_ take a tensor list first
                if comm:
                    extra["comm"] = comm
            try:
                extra["tf32"] = bool(ef.allow_tf32_cublas)
            except Exception:  # noqa: BLE001
                pass
            try:
                extra["user"] = user_scope is not None and ef.scope == user_scope
            except Exception:  # noqa: BLE001
                pass
        elif tag == "pyc" and not ev.children:
            # a leaf C call (min, len, list.append): half the events of Python-heavy code, and
            # nothing the analysis uses; its time stays in its Python caller's self time
            dropped += 1
            continue
        elif tag in ("py", "pyc"):
            extra = _frame(ef.caller)
        else:
            extra = {"corr": int(getattr(ev, "correlation_id", 0) or 0)}
        idx = len(nodes)
        start = int(ev.start_time_ns) - t0
        end = start + max(0, int(ev.duration_time_ns))
        nodes.append([idx, parent, tag, _text(lambda: ev.name), int(ev.start_tid), start, end, extra])
        for c in reversed(ev.children):
            stack.append((c, idx))
    return nodes, truncated, dropped


def _bytes_of(ke: Any) -> int | None:
    try:
        meta = _text(ke.metadata_json)
    except Exception:  # noqa: BLE001
        return None
    if not meta:
        return None
    try:
        d = json.loads("{" + meta + "}") if not meta.lstrip().startswith("{") else json.loads(meta)
    except ValueError:
        m = re.search(r'"bytes"\s*:\s*(\d+)', meta)
        return int(m.group(1)) if m else None
    b = d.get("bytes")
    return int(b) if isinstance(b, (int, float)) else None


def _get(ke: Any, attr: str, default: Any = None) -> Any:
    """``ke.attr()`` when this torch has it, else ``default`` (accessors differ across versions)."""
    try:
        return getattr(ke, attr)()
    except Exception:  # noqa: BLE001
        return default


def _kineto_lists(res: Any, t0: int) -> tuple[list, list]:
    from torch.autograd import DeviceType

    device: list = []
    runtime: list = []
    for ke in res.events():
        name = _text(ke.name)
        act = _get(ke, "activity_type", None)
        if isinstance(act, int) or (isinstance(act, str) and act.isdigit()):
            act = _ACT_NAMES.get(int(act), str(act))
        act = str(act).lower() if act is not None else ""
        dev = _get(ke, "device_type")
        start = int(ke.start_ns()) - t0
        end = start + max(0, int(_get(ke, "duration_ns", 0) or 0))
        corr = int(_get(ke, "correlation_id", 0) or 0)
        link = int(_get(ke, "linked_correlation_id", 0) or 0)
        if dev == DeviceType.CUDA:
            if act == "kernel":
                kind = "kernel"
            elif act == "gpu_memcpy" or name.startswith("Memcpy"):
                kind = "memcpy"
            elif act == "gpu_memset" or name.startswith("Memset"):
                kind = "memset"
            elif not act and not name.startswith(("cuda", "Stream", "Context", "Event")):
                kind = "kernel"
            else:
                kind = "other"
            stream = int(_get(ke, "device_resource_id", 0) or 0)
            device.append([name[:MAX_NAME], kind, start, end, corr, link, stream,
                           _bytes_of(ke) if kind == "memcpy" else None])
        elif act in ("cuda_runtime", "cuda_driver") or (not act.startswith(("cpu", "python", "user"))
                                                         and _RUNTIME_NAME.match(name)):
            runtime.append([name, start, end, corr, link, int(_get(ke, "start_thread_id", 0) or 0)])
    return device, runtime


def collect(prof: Any) -> dict[str, Any]:
    """Flatten the last profiler cycle into plain data (see the module docstring)."""
    import torch

    res = prof.profiler.kineto_results
    t0 = int(res.trace_start_ns())
    nodes, truncated, dropped = _tree_nodes(res, t0)
    device, runtime = _kineto_lists(res, t0)
    return {"version": FLAT_VERSION, "torch": torch.__version__, "nodes": nodes,
            "device": device, "runtime": runtime, "truncated": truncated,
            "leaf_c_calls_dropped": dropped}
