"""Nothing in a checkpoint runs during an audit; the weights_only verdict matches torch's own.

Every malicious fixture would create a marker file if unpickled (a positive control proves
it); the audit, in process and through the CLI, must list the dangerous globals and the
marker must never appear. ``--unsafe-load`` is the one documented exception.
"""

import importlib.util
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchdoctor.checkpoint import allowlist
from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.checkpoint.pickle_scan import scan_pickle
from torchdoctor.checkpoint.stub_unpickler import StubUnpickler, stub_load
from torchdoctor.checkpoint.summary import weights_only_verdict

HERE = Path(__file__).resolve().parent


def _load_builders():
    if "ckpt_builders" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ckpt_builders",
                                                      HERE / "fixtures" / "checkpoint" / "builders.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ckpt_builders"] = mod  # torch.save of a whole Net pickles it by module name
        spec.loader.exec_module(mod)
    return sys.modules["ckpt_builders"]


builders = _load_builders()


@pytest.fixture(scope="module")
def evil():
    files = dict(builders.cached("evil"))
    return files, files.pop("_marker")


def test_malicious_fixtures_are_live(evil, tmp_path):
    """Positive control: plain unpickling of a fixture does create the marker."""
    files, _marker = evil
    marker = str(tmp_path / "control")
    files2 = builders.build_malicious(str(tmp_path / "f"), marker)
    code = f"import pickle; pickle.load(open({files2['plain_pickle']!r}, 'rb'))"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert os.path.exists(marker)


def test_audit_runs_nothing_in_process(evil):
    files, marker = evil
    for name, path in files.items():
        rep = run(path, Options())
        unsafe = [f for f in rep.findings if f.code == "ckpt-unsafe-pickle"]
        assert unsafe and unsafe[0].severity == "error", (name, [f.title for f in rep.findings])
        assert "runs code" in unsafe[0].title, (name, unsafe[0].title)
        assert not os.path.exists(marker), f"{name} executed code"


def test_audit_runs_nothing_through_the_cli(cli, evil):
    files, marker = evil
    for name in ("torch_system", "legacy_system", "proto4_system", "zip_getattr", "dcp_metadata"):
        r = cli("checkpoint-audit", files[name], "--json")
        assert r.returncode == 1 and "Traceback" not in r.stderr, (name, r.stderr)  # code-running: an error
        assert "ckpt-unsafe-pickle" in r.stdout
    assert not os.path.exists(marker)


def test_evidence_shows_the_call_it_would_make(evil):
    files, marker = evil
    f = next(f for f in run(files["torch_system"], Options()).findings if f.code == "ckpt-unsafe-pickle")
    assert f.evidence["code_running_globals"] in (["posix.system"], ["os.system"])
    assert any(f"touch {marker}" in c for c in f.evidence["code_it_would_run"])
    g = next(f for f in run(files["zip_getattr"], Options()).findings if f.code == "ckpt-unsafe-pickle")
    assert {"builtins.getattr", "builtins.__import__"} <= set(g.evidence["code_running_globals"])


def test_unsafe_load_is_explicit_and_warned(cli, tmp_path):
    files = builders.build_malicious(str(tmp_path / "f"), str(tmp_path / "M"))
    r = cli("checkpoint-audit", files["torch_system"], "--unsafe-load", "--json")
    assert "RUNS NOW" in r.stderr and "weights_only=False" in r.stderr
    assert os.path.exists(tmp_path / "M")  # the documented exception: it really unpickles


def test_unsafe_load_audits_real_objects(tmp_path):
    import argparse

    p = tmp_path / "ns.pt"
    m = builders.build_model()
    torch.save({"model": m, "args": argparse.Namespace(fp16=True)}, p)
    rep = run(str(p), Options(unsafe_load=True))
    codes = {f.code for f in rep.findings}
    assert {"ckpt-unsafe-pickle", "ckpt-full-model-pickle"} <= codes
    assert rep.metrics["checkpoint"]["roles"]["model"]["tensors"] == 9
    assert rep.metrics["checkpoint"]["unsafe_load"] is True


def test_allowlist_mirror_matches_installed_torch():
    from torch._weights_only_unpickler import _get_allowed_globals

    allowed = set(_get_allowed_globals())
    assert all(allowlist.is_weights_only_global(g) for g in allowed), sorted(
        g for g in allowed if not allowlist.is_weights_only_global(g))
    for g in ("argparse.Namespace", "posix.system", "builtins.getattr", "numpy.ndarray", "pathlib.PosixPath",
              "torch.nn.modules.linear.Linear", "builtins.eval", "torch.load"):
        assert not allowlist.is_weights_only_global(g)


def _torch_loads(path: str, numpy_ok: bool) -> bool:
    import numpy as np

    ctx = torch.serialization.safe_globals([np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                                            np.dtypes.UInt32DType]) if numpy_ok else _Null()
    try:
        with ctx:
            torch.load(path, weights_only=True, map_location="cpu")
        return True
    except Exception:  # noqa: BLE001
        return False


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_weights_only_verdict_matches_torch_load():
    from torchdoctor.checkpoint.reader import read

    paths = {k: v for k, v in builders.cached("all").items() if k != "_marker"}
    checked = 0
    for name, path in paths.items():
        if not os.path.isfile(path) or not path.endswith((".pt", ".pth")):
            continue
        verdict = weights_only_verdict(read(path))
        expect_ok = verdict != "refused"
        assert _torch_loads(path, verdict.startswith("loads after")) == expect_ok, (name, verdict)
        if verdict.startswith("loads after"):
            assert not _torch_loads(path, False), name  # the allowlist really is needed
        checked += 1
    assert checked >= 20


def test_static_scan_lists_every_global_the_unpickler_asks_for(tmp_path):
    files = builders.build_malicious(str(tmp_path / "f"), str(tmp_path / "M"))
    import zipfile

    samples = [pickle.dumps({"a": [1, 2.0, "x", b"y", (3,)], "s": {1}}, protocol=p) for p in range(6)]
    with zipfile.ZipFile(files["torch_system"]) as z:
        samples.append(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    samples.append(open(files["plain_getattr"], "rb").read())
    for raw in samples:
        info, _ = scan_pickle(raw)
        u = StubUnpickler(io.BytesIO(raw), on_storage=lambda pid: None)
        u.load()
        assert set(info.globals) == set(u.found), (info.globals, list(u.found))
    assert not os.path.exists(tmp_path / "M")


def test_stub_unpickler_rebuilds_plain_data_exactly():
    data = {"a": [1, 2.5, "x", b"bytes", (3, None, True)], "s": {1, 2}, "f": frozenset({3}), "c": complex(1, 2),
            "nested": {"k": bytearray(b"ab")}}
    for proto in range(6):
        assert stub_load(pickle.dumps(data, protocol=proto)) == data


def test_stub_unpickler_refuses_allocation_bombs():
    bomb = b"\x80\x02c__builtin__\nbytearray\nq\x00J\x00\x00\x00\x7f\x85q\x01Rq\x02."  # bytearray(2**31-ish)
    with pytest.raises(pickle.UnpicklingError):
        stub_load(bomb)
