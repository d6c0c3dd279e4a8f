"""Unit tests of the checkpoint pieces: NaN/Inf scan per dtype, roles, comparisons."""

import os
import struct

import numpy as np
import pytest
import torch

from torchdoctor.checkpoint import scan as scan_mod
from torchdoctor.checkpoint.compare import compare_optimizer, compare_state
from torchdoctor.checkpoint.reader import read
from torchdoctor.checkpoint.roles import recognise
from torchdoctor.checkpoint.scan import scan_tensors
from torchdoctor.checkpoint.values import Storage, TensorInfo
from torchdoctor.checkpoint.walk import iter_tensors


def _scan_file(path):
    c = read(str(path))
    return scan_tensors(list(iter_tensors(c.root)))


@pytest.fixture(params=["numpy", "torch"])
def backend(request, monkeypatch):
    """Every scan test runs with numpy and with the torch fallback (installs without numpy)."""
    if request.param == "torch":
        def no_numpy():
            raise ImportError("numpy hidden by the test")

        from torchdoctor.checkpoint import scan_ops

        monkeypatch.setattr(scan_ops, "NumpyOps", no_numpy)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.complex64, torch.float8_e5m2])
def test_scan_counts_nan_and_inf_per_dtype(tmp_path, dtype, backend):
    t = torch.zeros(1000, dtype=torch.float32)
    t[3], t[10], t[11], t[500] = float("nan"), float("inf"), float("inf"), float("-inf")
    t = t.to(dtype)
    torch.save({"w": t, "ok": torch.ones(10, dtype=dtype)}, tmp_path / "x.pt")
    res = _scan_file(tmp_path / "x.pt")
    assert [h.name for h in res.hits] == ["w"]
    h = res.hits[0]
    if dtype.is_complex:  # real and imaginary parts checked as floats
        assert h.nan >= 1 and h.posinf + h.neginf >= 3
    else:
        assert (h.nan, h.posinf, h.neginf, h.first_index) == (1, 2, 1, 3)


def test_scan_float8_e4m3fn_nan(tmp_path, backend):
    t = torch.zeros(64, dtype=torch.float32)
    t[7] = float("nan")
    torch.save({"w": t.to(torch.float8_e4m3fn)}, tmp_path / "x.pt")
    h = _scan_file(tmp_path / "x.pt").hits
    assert len(h) == 1 and h[0].nan == 1 and h[0].first_index == 7


def test_scan_finds_value_at_a_window_boundary(tmp_path, monkeypatch, backend):
    monkeypatch.setattr(scan_mod, "CHUNK", 4096)
    t = torch.ones(10_000)
    t[4096 // 4] = float("nan")  # first element of the second window
    t[-1] = float("inf")
    torch.save({"w": t, "b": torch.ones(3)}, tmp_path / "x.pt")
    res = _scan_file(tmp_path / "x.pt")
    assert [(h.name, h.nan, h.posinf) for h in res.hits] == [("w", 1, 1)]
    assert res.bytes_scanned == 10_000 * 4 + 12


def test_scan_attributes_to_the_view_not_the_whole_storage(tmp_path, backend):
    base = torch.ones(100)
    base[90] = float("nan")
    torch.save({"head": base[:50], "tail": base[80:]}, tmp_path / "x.pt")  # one shared storage
    res = _scan_file(tmp_path / "x.pt")
    assert [(h.name, h.nan, h.first_index) for h in res.hits] == [("tail", 1, 10)]


def test_scan_big_endian_storage(tmp_path, backend):
    arr = np.array([1.0, np.nan, 2.0, np.inf], dtype=">f4")
    p = tmp_path / "be.bin"
    p.write_bytes(b"\0" * 8 + arr.tobytes())
    t = TensorInfo("float32", (4,), storage=Storage(str(p), 8, 16, "k", "float32", byteorder="big"))
    res = scan_tensors([("w", t)])
    assert res.backend.startswith(backend)
    assert (res.hits[0].nan, res.hits[0].posinf) == (1, 1)


def test_scan_memory_stays_bounded(tmp_path):
    """Windows are unmapped as the scan moves on: RSS grows by far less than the data."""
    import resource

    t = torch.randn(48 * 2**20 // 4)  # 48 MiB
    torch.save({"w": t}, tmp_path / "big.pt")
    del t
    c = read(str(tmp_path / "big.pt"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scan_tensors(list(iter_tensors(c.root)))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 2 * scan_mod.CHUNK / 2**20 + 8


def test_safetensors_reader_shapes_and_metadata(tmp_path):
    header = {"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
              "b": {"dtype": "I64", "shape": [], "data_offsets": [12, 20]}, "__metadata__": {"format": "pt"}}
    import json

    h = json.dumps(header).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + bytes(20))
    c = read(str(tmp_path / "m.safetensors"))
    assert c.format == "safetensors" and c.metadata == {"format": "pt"}
    assert {k: (t.dtype, t.shape) for k, t in c.root.items()} == {"a": ("bfloat16", (2, 3)), "b": ("int64", ())}


def test_roles_of_a_lightning_style_checkpoint():
    t = TensorInfo("float32", (4, 4))
    ck = {"epoch": 2, "global_step": 300, "pytorch-lightning_version": "2.4",
          "state_dict": {"model.w": t, "model.b": TensorInfo("float32", (4,))},
          "optimizer_states": [{"state": {0: {"exp_avg": t}}, "param_groups": [{"lr": 1, "params": [0, 1]}]}],
          "lr_schedulers": [{"last_epoch": 300, "_last_lr": [0.1], "base_lrs": [0.1]}],
          "MixedPrecision": {"scale": 1024.0, "growth_factor": 2.0}, "hyper_parameters": {"precision": "16-mixed"}}
    r = recognise(ck)
    assert r.model.path == "state_dict" and len(r.optimizers) == 1
    assert r.schedulers == ["lr_schedulers"] and r.scalers == ["MixedPrecision"]
    assert set(r.progress) == {"epoch", "global_step"} and r.config == ["hyper_parameters"]
    assert r.fp16_signs == ["hyper_parameters.precision='16-mixed'"]


def test_roles_bf16_amp_is_not_an_fp16_sign():
    r = recognise({"model": {"w": TensorInfo("float32", (2,))}, "args": {"amp": True, "amp_dtype": "bfloat16"}})
    assert r.fp16_signs == [] and r.bf16_signs


def test_compare_state_finds_prefix_rewrites_and_mismatches():
    model = {"fc.weight": ((2, 4), "float32"), "fc.bias": ((2,), "float32")}
    ddp = {"module.fc.weight": ((2, 4), "float32"), "module.fc.bias": ((2,), "float32")}
    res = compare_state(ddp, model)
    assert res.transform == "strip 'module.'" and not res.missing and not res.unexpected
    wrapped_model = {"model." + k: v for k, v in model.items()}
    assert compare_state(model, wrapped_model).transform == "add 'model.'"
    other = {"fc.weight": ((3, 4), "float32"), "fc.bias": ((2,), "bfloat16"), "extra": ((1,), "float32")}
    res = compare_state(other, model)
    assert res.shape == [("fc.weight", [3, 4], [2, 4])] and res.dtype == [("fc.bias", "bfloat16", "float32")]
    assert res.unexpected == ["extra"] and res.missing == []


def test_compare_optimizer_certain_and_inconclusive_cases():
    t = lambda *s: TensorInfo("float32", s)  # noqa: E731
    params = [("a", (2, 4)), ("b", (2,))]
    ok = compare_optimizer({0: {"exp_avg": t(2, 4)}, 1: {"exp_avg": t(2)}}, [0, 1], params, exact_order=True)
    assert ok.problems == []
    swapped = compare_optimizer({0: {"exp_avg": t(2)}, 1: {"exp_avg": t(2, 4)}}, [0, 1], params, exact_order=False)
    assert swapped.problems == []  # custom order: not provably wrong without the model
    wrong = compare_optimizer({0: {"exp_avg": t(8, 4)}}, [0, 1], params, exact_order=False)
    assert "shapes no parameter has" in wrong.problems[0]
    too_many = compare_optimizer({}, [0, 1, 2], params, exact_order=False)
    assert "param_groups list 3 parameters, the model has 2" in too_many.problems[0]
    by_name = compare_optimizer({"a": {"exp_avg": t(2, 4)}}, ["a", "zz"], params, exact_order=False)
    assert "not in the model" in by_name.problems[0]
    adafactor = compare_optimizer({0: {"exp_avg_sq_row": t(2)}}, [0], params, exact_order=True)
    assert adafactor.problems == []  # factored state is not parameter-shaped


def test_unsupported_dtype_is_reported_not_scanned(tmp_path):
    t = TensorInfo("float4_e2m1fn_x2", (8,), storage=Storage(os.devnull, 0, 8, "k", "float4_e2m1fn_x2"))
    res = scan_tensors([("w", t)])
    assert res.hits == [] and res.not_scanned == []  # not a float dtype we claim to check


def test_walk_handles_cycles():
    a: dict = {"t": TensorInfo("float32", (1,))}
    a["self"] = a
    assert [n for n, _t in iter_tensors(a)] == ["t"]


def test_hub_folder_with_both_weight_formats_reads_safetensors(tmp_path):
    import json as _json

    h = _json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + bytes(4))
    torch.save({"w": torch.ones(1)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    c = read(str(tmp_path))
    assert c.format == "safetensors" and "pytorch_model.bin, not read" in c.notes[0]


def test_fast_finite_check_falls_back_on_overflow():
    import numpy as np

    from torchdoctor.checkpoint.scan_ops import NumpyOps

    ops = NumpyOps()
    assert ops.bad(np.array([1, 2, np.nan], np.float32), "float32")
    assert not ops.bad(np.array([1e20, 1], np.float32), "float32")  # x·x overflows, values are finite
    assert ops.bad(np.array([1e20, -np.inf], np.float32), "float32")
    assert not ops.bad(np.ones(5), "float64")
