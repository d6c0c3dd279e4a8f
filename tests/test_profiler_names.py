"""Names from the profiler that are not valid UTF-8 (issue 27 item 3).

pybind11 turns a C++ ``std::string`` into ``str`` with a strict UTF-8 decode, so reading the
``name`` of a profiler event whose bytes are not UTF-8 (a demangled kernel template, a name cut
inside a multi-byte character) raises ``UnicodeDecodeError`` on access: on timm it cost the whole
profile window. The fakes below raise exactly that on access, as pybind does; the flattening must
decode them with replacement and keep every event.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._C._profiler import _EventType  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402

from torchdoctor.instruments.profile import _profiler_compat as compat  # noqa: E402
from torchdoctor.instruments.profile._profile_analysis import analyze  # noqa: E402
from torchdoctor.instruments.profile._profile_plan import make_sources  # noqa: E402

OP_RAW = b"aten::mm_\xff\xfe"  # not UTF-8
KERNEL_RAW = b"void gemm<float, \xe2\x82>(float*)"  # cut inside a 3-byte character
FILE_RAW = b"/work/train_\xff.py"


def _strict(raw: bytes):
    """What pybind does with the C++ bytes: decode strictly, raise on bad ones."""
    def get(*_a):
        return raw.decode("utf-8")
    return get


class _Frame:
    line_number = 7
    file_name = property(lambda self: _strict(FILE_RAW)())
    function_name = property(lambda self: _strict(b"step_\xc3")())


class _OpFields:
    inputs: list = []
    allow_tf32_cublas = False
    scope = None


class _PyFields:
    caller = _Frame()


class _Ev:
    def __init__(self, tag, raw, start, dur, children=(), fields=None):
        self.tag, self._raw = tag, raw
        self.start_time_ns, self.duration_time_ns = start, dur
        self.children = list(children)
        self.extra_fields = fields
        self.correlation_id = 1
        self.start_tid = 1

    @property
    def name(self):
        return _strict(self._raw)()


class _Kineto:
    def __init__(self, raw, act, dev):
        self._raw, self._act, self._dev = raw, act, dev

    def name(self):
        return _strict(self._raw)()

    def activity_type(self):
        return self._act

    def device_type(self):
        return self._dev

    def start_ns(self):
        return 100

    def duration_ns(self):
        return 50

    def correlation_id(self):
        return 2

    def linked_correlation_id(self):
        return 1

    def device_resource_id(self):
        return 7

    def metadata_json(self):
        return _strict(b'"bytes": 12, "note": "\xff"')()


class _Results:
    def trace_start_ns(self):
        return 0

    def experimental_event_tree(self):
        op = _Ev(_EventType.TorchOp, OP_RAW, 10, 40, fields=_OpFields())
        leaf = _Ev(_EventType.PyCCall, b"len", 12, 1, fields=_PyFields())
        py = _Ev(_EventType.PyCall, b"train_\xff.py(7): step", 5, 60, children=[op, leaf], fields=_PyFields())
        return [_Ev(_EventType.TorchOp, b"ProfilerStep#1", 0, 100, children=[py], fields=_OpFields())]

    def events(self):
        return [_Kineto(KERNEL_RAW, "kernel", DeviceType.CUDA),
                _Kineto(b"Memcpy HtoD \xff", "gpu_memcpy", DeviceType.CUDA),
                _Kineto(b"cudaLaunchKernel\xff", "cuda_runtime", DeviceType.CPU)]


class _Prof:
    class profiler:  # noqa: N801 - the attribute path torch.profiler.profile has
        kineto_results = _Results()


def test_the_fakes_raise_as_pybind_does():
    with pytest.raises(UnicodeDecodeError):
        _Ev(_EventType.TorchOp, OP_RAW, 0, 1).name


def test_non_utf8_names_are_decoded_with_replacement_and_every_event_kept():
    flat = compat.collect(_Prof())
    names = [n[3] for n in flat["nodes"]]
    assert names == ["ProfilerStep#1", "train_\ufffd.py(7): step", "aten::mm_\ufffd\ufffd"]
    assert flat["nodes"][1][7] == {"file": "/work/train_\ufffd.py", "line": 7, "func": "step_\ufffd"}
    assert flat["leaf_c_calls_dropped"] == 1
    assert [d[0] for d in flat["device"]] == ["void gemm<float, \ufffd>(float*)", "Memcpy HtoD \ufffd"]
    assert [d[1] for d in flat["device"]] == ["kernel", "memcpy"]
    assert flat["device"][1][7] == 12  # the transfer size still read from the metadata
    assert [r[0] for r in flat["runtime"]] == ["cudaLaunchKernel\ufffd"]


def test_the_window_with_such_names_is_analysed(tmp_path):
    flat = compat.collect(_Prof())
    out = analyze(flat, make_sources((str(tmp_path),)))
    assert out["profile_window"].get("steps"), out["profile_window"]
    assert "aten::mm_\ufffd\ufffd" in repr(out["profile_ops"])
    assert "void gemm<float, \ufffd>(float*)" in repr(out["profile_kernels"])
    assert {"profile_host", "profile_python", "profile_device", "profile_syncs"} <= set(out)


def test_text_helper_keeps_valid_names_and_non_strings():
    assert compat._text(lambda: "aten::add") == "aten::add"
    assert compat._text(lambda: b"k\xff") == "k\ufffd"
    assert compat._text(lambda: None) == ""
