"""Hostile checkpoints (issue 14): no escape byte reaches the terminal, code-running files are
errors, truncated payloads are still judged, bombs are refused before work, crafted values never
crash the audit, FIFOs never hang it. Every input is built here (tests/fixtures/checkpoint/hostile.py).
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.report.console import render_to_text
from torchdoctor.report.jsonout import render_json

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _load(name, file):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "fixtures" / "checkpoint" / file)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


H = _load("ckpt_hostile", "hostile.py")
builders = _load("ckpt_builders", "builders.py")


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


# The child reports its own peak RSS (VmHWM of its address space after exec): ru_maxrss of a child
# also counts the parent's pages it shared between fork and exec, i.e. pytest's torch import.
_WRAPPER = """
import atexit, os, resource, runpy, sys
def _hwm():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM"))
    with open(os.environ["TD_HWM_FILE"], "w") as f:
        f.write(kb)
atexit.register(_hwm)
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))  # a regression fails the test instead of hogging the box
sys.argv = ["torchdoctor", *sys.argv[1:]]
runpy.run_module("torchdoctor", run_name="__main__", alter_sys=True)
"""


def bounded_cli(*args, timeout=60):
    """Run the CLI in a child; return (returncode, stdout bytes, stderr text, peak RSS MB, CPU s) of that child."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as hwm:
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120", TERM="dumb", TD_HWM_FILE=hwm.name)
        p = subprocess.Popen([sys.executable, "-c", _WRAPPER, *map(str, args)], stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                raise AssertionError(f"checkpoint-audit hung: {args}")
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        rss_mb = int(hwm.read() or 0) / 1024
        return (p.returncode, out.read(), err.read().decode("utf-8", "replace"), rss_mb,
                ru.ru_utime + ru.ru_stime)


# -- S1: terminal injection ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def injected(tmp_path_factory):
    """A live os.system checkpoint whose tensor location erases lines, plus keys with ESC and markup."""
    import torch
    import torch.serialization as S

    d = tmp_path_factory.mktemp("inject")
    marker = str(d / "MARKER")
    erase = "\x1b[1A\x1b[2K" * 12

    def tag(_obj):
        return erase

    S.register_package(-100, tag, lambda obj, loc: None)
    try:
        torch.save({"model": {"w": torch.ones(3)}, "[/x]": 1, "\x1b[31mred\x1b[0m": "v\x1b]0;title\x07\x9b2J",
                    "hook": builders._System(marker)}, d / "evil.pt")
    finally:
        S._package_registry[:] = [p for p in S._package_registry if p[1] is not tag]
    return d / "evil.pt", marker


@pytest.fixture
def cli_main():
    """The console entry point in this process (``conftest.run_main``): the audit reads, never
    runs, what it is given, and exit codes, rendering and "no traceback" (an escaped exception is
    raised here) do not depend on a process of its own; the resource bounds below keep theirs."""
    from conftest import run_main

    return run_main


def test_escape_bytes_never_reach_the_console(cli_main, injected):
    path, marker = injected
    r = cli_main("checkpoint-audit", path)
    assert r.returncode == 1, r.stderr  # the os.system payload is an error
    assert "Traceback" not in r.stderr and "MarkupError" not in r.stderr
    assert "\x1b" not in r.stdout and "\x9b" not in r.stdout and "\x07" not in r.stdout
    assert "ckpt-unsafe-pickle" in r.stdout and "No problems found" not in r.stdout
    assert "\\x1b[1A\\x1b[2K" in r.stdout  # shown, visibly
    assert "[/x]" in r.stdout  # a key that is rich markup is printed as text
    assert not os.path.exists(marker)


def test_json_stays_valid_and_faithful(cli_main, injected):
    path, _marker = injected
    r = cli_main("checkpoint-audit", path, "--json")
    d = json.loads(r.stdout)
    keys = [e["key"] for e in d["metrics"]["checkpoint"]["entries"]]
    assert "[/x]" in keys and "\x1b[31mred\x1b[0m" in keys  # the data as it is, escaped by JSON itself
    assert "\x1b" not in r.stdout  # JSON escapes C0 controls (\u001b)
    dev = next(f for f in d["findings"] if f["code"] == "ckpt-device-tensors")
    assert "\x1b[1A" in dev["title"]


def test_markup_key_in_the_contents_table_does_not_crash():
    from torchdoctor.findings import Report
    from torchdoctor.report.sections.checkpoint import checkpoint_contents

    rep = Report("checkpoint-audit", target="x")
    rep.metrics["checkpoint"] = {"format": "torch-zip", "files": 1, "file_bytes": 10, "tensors": 1,
                                 "tensor_bytes": 4, "judged_as": "weights", "expect": "auto",
                                 "entries": [{"key": "[/x]", "role": "[bold]", "type": "str", "value": "[/]\x1b[2J",
                                              "dtypes": {"\x1b[1m": 1}, "devices": {"cuda\x1b[2K": 1}}]}
    text = render_to_text(rep)
    assert "[/x]" in text and "\\x1b[2J" in text and "\x1b" not in text
    checkpoint_contents(rep)


# -- S2: code-running globals are errors ---------------------------------------------------------------

CODE_RUNNING = [("posix", "system"), ("nt", "system"), ("os", "system"), ("builtins", "eval"), ("builtins", "exec"),
                ("builtins", "__import__"), ("builtins", "getattr"), ("builtins", "compile"), ("builtins", "open"),
                ("subprocess", "Popen"), ("subprocess", "check_output"), ("runpy", "run_path"),
                ("importlib", "import_module"), ("pty", "spawn"), ("socket", "create_connection"),
                ("operator", "attrgetter"), ("torch", "load"), ("numpy.testing._private.utils", "runstring")]


@pytest.mark.parametrize("module,name", CODE_RUNNING)
def test_code_running_global_is_an_error(tmp_path, module, name):
    marker = tmp_path / "M"
    p = H.zip_ckpt(str(tmp_path / "c.pt"), H.dict_pickle([("model", b"}"), ("x", H.call_pickle(
        module, name, f"touch {marker}")[2:-1])]))
    rep = run(p, Options())
    f = next(f for f in rep.findings if f.code == "ckpt-unsafe-pickle")
    assert f.severity == "error" and "runs code" in f.title, f.title
    assert f"{module}.{name}" in f.evidence["code_running_globals"]
    assert rep.exit_code() == 1 and not marker.exists()


@pytest.mark.parametrize("cls", ["mypkg.config.TrainConfig", "collections.defaultdict", "pathlib.PosixPath",
                                 "__main__.Net"])
def test_plain_classes_stay_warnings(tmp_path, cls):
    module, name = cls.rsplit(".", 1)
    p = H.zip_ckpt(str(tmp_path / "c.pt"), H.call_pickle(module, name, "x"))
    f = next(f for f in run(p, Options()).findings if f.code == "ckpt-unsafe-pickle")
    assert f.severity == "warning", f.title


# -- S3: truncated malicious pickles keep the globals seen ----------------------------------------------

def _truncated(tmp_path, kind):
    marker = str(tmp_path / "MARKER")
    payload = H.truncated_system(marker)
    if kind == "zip":
        return H.zip_ckpt(str(tmp_path / "t.pt"), payload), marker
    if kind == "plain":
        (tmp_path / "t.pkl").write_bytes(payload)
        return str(tmp_path / "t.pkl"), marker
    if kind == "protocol0":
        (tmp_path / "t0.pkl").write_bytes(f"cposix\nsystem\n(Vtouch {marker}\ntR".encode() + b"\xff junk")
        return str(tmp_path / "t0.pkl"), marker
    if kind == "hf_folder":
        d = tmp_path / "checkpoint-10"
        d.mkdir()
        builders.write_safetensors({"w": __import__("torch").ones(2)}, str(d / "model.safetensors"))
        (d / "optimizer.pt").write_bytes(open(H.zip_ckpt(str(tmp_path / "o.pt"), payload), "rb").read())
        (d / "trainer_state.json").write_text('{"global_step": 10}')
        return str(d), marker
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["zip", "plain", "protocol0", "hf_folder"])
def test_truncated_malicious_pickle_is_judged(tmp_path, kind):
    path, marker = _truncated(tmp_path, kind)
    rep = run(path, Options())
    codes = _codes(rep)
    assert codes.get("ckpt-unreadable") == "error" and codes.get("ckpt-unsafe-pickle") == "error", \
        [(f.code, f.title) for f in rep.findings]
    f = next(f for f in rep.findings if f.code == "ckpt-unsafe-pickle")
    assert "posix.system" in f.evidence["code_running_globals"] and f.evidence.get("scan_stopped_early")
    assert not os.path.exists(marker)


# -- S4: resource bombs ----------------------------------------------------------------------------

def test_zip64_size_claim_is_checked_before_any_window(tmp_path):
    p = H.zip64_size_bomb(str(tmp_path / "z64.pt"))
    assert os.path.getsize(p) < 2000
    rc, out, err, rss, cpu = bounded_cli("checkpoint-audit", p, "--json")
    assert rc == 1 and "Traceback" not in err, err
    assert rss < 300 and cpu < 5, (rss, cpu)
    f = next(f for f in json.loads(out)["findings"] if f["code"] == "ckpt-unreadable")
    assert "past the end of the file" in f["title"]


def test_deflated_data_pkl_is_refused_unread(tmp_path):
    p = H.deflate_bomb(str(tmp_path / "bomb.pt"))
    assert os.path.getsize(p) < 1 << 20
    rc, out, err, rss, cpu = bounded_cli("checkpoint-audit", p, "--json")
    assert rc == 1 and rss < 300 and cpu < 5, (rc, rss, cpu, err)
    assert json.loads(out)["findings"][0]["evidence"]["problem"] == "compressed data.pkl"


def test_huge_plain_pickle_is_read_bounded(tmp_path):
    p = H.sparse_pickle(str(tmp_path / "big.pkl"))  # 2 GB, sparse on disk
    rc, out, err, rss, cpu = bounded_cli("checkpoint-audit", p, "--json")
    assert rc == 1 and rss < 300 and cpu < 10, (rc, rss, cpu, err)
    assert json.loads(out)["findings"][0]["evidence"]["problem"] == "oversized pickle"


# -- S6: crafted values never crash the audit --------------------------------------------------------

def _crafted(tmp_path):
    t = str(tmp_path)
    return {
        "5000_digit_int": H.zip_ckpt(t + "/int.pt", H.dict_pickle([("epoch", H.long4(10 ** 5000)),
                                                                  ("step", H.long4(-10 ** 5000))])),
        "infinite_offset": H.safetensors(
            t + "/inf.safetensors", '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1e999]}}', b"\0" * 4),
        "negative_offset": H.safetensors(t + "/neg.safetensors",
                                         {"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 4),
        "huge_shape_st": H.safetensors(t + "/shape.safetensors",
                                       {"w": {"dtype": "F32", "shape": [2 ** 62, 2 ** 62], "data_offsets": [0, 4]}},
                                       b"\0" * 4),
        "huge_shape_zip": H.zip_ckpt(t + "/shape.pt", H.tensor_pickle(numel=2 ** 31 - 1), {"0": b"\0" * 16}),
        "self_index": H.self_index(t + "/idx"),
        "nested": H.zip_ckpt(t + "/nest.pt", H.nested_lists(100_000)),
        "self_reference": H.zip_ckpt(t + "/self.pt", H.self_referencing_dict()),
        "dag_bomb": H.zip_ckpt(t + "/dag.pt", H.dag_bomb()),
        "odd_storage_size": H.zip_ckpt(t + "/odd.pt", H.tensor_pickle(numel=4), {"0": b"\0" * 7}),
        "call_chain": H.zip_ckpt(t + "/chain.pt", H.call_chain()),
        "shared_nan_tensor": H.shared_nan_tensor(t + "/shared.pt"),
    }


def test_crafted_values_give_a_report_not_a_crash(tmp_path):
    for name, path in _crafted(tmp_path).items():
        t0 = time.process_time()
        rep = run(path, Options())
        render_to_text(rep)
        json.loads(render_json(rep))
        assert time.process_time() - t0 < 5, name
        assert "internal-error" not in _codes(rep), (name, [(f.title, f.evidence) for f in rep.findings])


@pytest.mark.parametrize("case", ["5000_digit_int", "infinite_offset", "negative_offset", "self_index"])
def test_crafted_values_through_the_cli(cli_main, tmp_path, case):
    r = cli_main("checkpoint-audit", _crafted(tmp_path)[case], "--json")
    json.loads(r.stdout)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def test_negative_safetensors_offset_is_unreadable(tmp_path):
    p = _crafted(tmp_path)["negative_offset"]
    assert _codes(run(p, Options())) == {"ckpt-unreadable": "error"}


def test_a_crashing_stage_is_an_internal_finding(monkeypatch):
    import torchdoctor.checkpoint.scan as scan

    monkeypatch.setattr(scan, "scan_tensors", lambda named: 1 / 0)
    rep = run(builders.cached("all")["complete"], Options())
    f = next(f for f in rep.findings if f.code == "internal-error")
    assert "scan" in f.title and "ckpt-nonfinite-weights" in {s.rule for s in rep.skipped}


def test_permission_error_in_one_folder_part_is_a_problem(monkeypatch):
    path = builders.cached("all")["hf_trainer"]
    real = os.open

    def deny(file, *a, **k):
        if str(file).endswith("scheduler.pt"):
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    rep = run(path, Options())
    f = next(f for f in rep.findings if f.code == "ckpt-unreadable")
    assert "scheduler.pt" in f.evidence["parts"][0] and "Permission denied" in f.evidence["parts"][0]
    assert rep.metrics["checkpoint"]["roles"]["optimizer"]  # the rest of the folder was still read


# -- S7: FIFOs, devices and links --------------------------------------------------------------------

def test_fifo_as_the_checkpoint_is_a_usage_error(tmp_path):
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    rc, out, err, _rss, _cpu = bounded_cli("checkpoint-audit", fifo, timeout=30)
    assert rc == 2 and out == b"" and "FIFO" in err and "Traceback" not in err


def test_device_as_the_checkpoint_is_a_usage_error():
    rc, _out, err, _rss, _cpu = bounded_cli("checkpoint-audit", "/dev/zero", timeout=30)
    assert rc == 2 and "character device" in err


def test_fifo_inside_a_folder_is_reported_not_opened(tmp_path):
    import torch

    d = tmp_path / "checkpoint-5"
    d.mkdir()
    builders.write_safetensors({"w": torch.ones(2)}, str(d / "model.safetensors"))
    os.mkfifo(d / "optimizer.pt")
    os.mkfifo(d / "trainer_state.json")
    rc, out, err, _rss, _cpu = bounded_cli("checkpoint-audit", d, "--json", timeout=30)
    assert rc == 1, err
    parts = next(f for f in json.loads(out)["findings"] if f["code"] == "ckpt-unreadable")["evidence"]["parts"]
    assert any("optimizer.pt: a FIFO" in p for p in parts) and any("trainer_state.json: a FIFO" in p for p in parts)


def test_fifo_dcp_metadata_is_not_opened(tmp_path):
    d = tmp_path / "dcp"
    d.mkdir()
    os.mkfifo(d / ".metadata")
    rc, out, err, _rss, _cpu = bounded_cli("checkpoint-audit", d, "--json", timeout=30)
    assert rc == 1 and "FIFO" in json.loads(out)["findings"][0]["title"], err


def test_symlink_out_of_a_folder_is_reported_not_followed(tmp_path):
    import torch

    outside = tmp_path / "secret.pt"
    torch.save({"w": torch.ones(2)}, outside)
    d = tmp_path / "checkpoint-7"
    d.mkdir()
    builders.write_safetensors({"w": torch.ones(2)}, str(d / "model.safetensors"))
    os.symlink(outside, d / "optimizer.pt")
    rep = run(str(d), Options())
    f = next(f for f in rep.findings if f.code == "ckpt-unreadable")
    assert "outside the checkpoint folder" in f.evidence["parts"][0]
    assert rep.metrics["checkpoint"]["roles"]["optimizer"] == []  # the linked file was not read


# -- exit codes (issue 14, item 14) --------------------------------------------------------------------

def test_exit_codes_match_the_docs(cli_main, tmp_path):
    (tmp_path / "trunc.pt").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    r = cli_main("checkpoint-audit", tmp_path / "trunc.pt", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["findings"][0]["code"] == "ckpt-unreadable"
    assert cli_main("checkpoint-audit", tmp_path / "missing.pt").returncode == 2
    (tmp_path / "empty").mkdir()
    assert cli_main("checkpoint-audit", tmp_path / "empty").returncode == 2
    docs = (ROOT / "docs" / "checkpoint.md").read_text() + (ROOT / "README.md").read_text() + \
        (ROOT / "docs" / "findings" / "ckpt-unreadable.md").read_text()
    assert "unreadable" in docs and "exit 1" in docs.lower()


# -- acceptance: a bounded fuzz of every container ------------------------------------------------------

FUZZ_SECONDS = float(os.environ.get("TORCHDOCTOR_FUZZ_SECONDS", "4"))


def _seeds(d: Path) -> Path:
    import shutil

    import torch

    d.mkdir()
    fx = builders.cached("all")
    for name in ("complete", "complete_legacy", "weights_safetensors", "full_model_pickle", "complete_numpy_rng"):
        shutil.copy(fx[name], d / (name + os.path.splitext(fx[name])[1]))
    shutil.copytree(fx["dcp"], d / "dcp")
    shutil.copytree(fx["hf_sharded"], d / "hf_sharded")
    shutil.copytree(fx["hf_trainer"], d / "hf_trainer")
    import pickle

    (d / "plain.pkl").write_bytes(pickle.dumps({"model": {"w": [1.0, 2.0]}, "epoch": 1}, protocol=2))
    torch.save({"w": torch.ones(2)}, d / "small.pt")
    return d


def test_fuzzed_containers_exit_cleanly_within_bounds(tmp_path):
    seeds = _seeds(tmp_path / "seeds")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(HERE / "fixtures" / "checkpoint" / "fuzz_driver.py"), str(seeds),
                        str(work), str(FUZZ_SECONDS), "1234"], capture_output=True, text=True, env=env,
                       timeout=120 + FUZZ_SECONDS * 4)
    assert r.returncode == 0, r.stderr[-2000:]
    stats = json.loads(r.stdout.strip().splitlines()[-1])
    print(stats)
    assert stats["inputs"] >= 10, stats
    assert stats["failures"] == [], stats["failures"][:5]
    assert stats["worst_cpu_s"] < 5, stats
    assert stats["peak_rss_mb"] < 300, stats
    assert not (work / "MARKER").exists()
