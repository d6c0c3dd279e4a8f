"""Bad input to checkpoint-audit: a one-line reason, the right exit code, never a traceback.

Exit codes (docs/checkpoint.md): a path that is missing, not a file or folder, cannot be
opened at all, or a folder with no checkpoint in it is bad usage → 2 with one line on
stderr; bytes that can be read but are not a readable checkpoint → a report with a
`ckpt-unreadable` error → 1.
"""

import json
import os
import struct
import zipfile

import pytest

from torchdoctor.pipeline.checkpoint import Options, run

from conftest import run_main  # the CLI in this process: exit codes and messages of an audit that reads, never runs

MINI_ZIP_PICKLE = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01K\x01s."  # {'a': 1}, protocol 2


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def _zip_ckpt(path, pickle_bytes=MINI_ZIP_PICKLE):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/version", "3\n")
    return str(path)


@pytest.fixture
def bad(tmp_path):
    full = _zip_ckpt(tmp_path / "full.pt")
    raw = open(full, "rb").read()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hi")
    (tmp_path / "emptydir").mkdir()
    st_header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return {
        "empty": (_write(tmp_path / "empty.pt", b""), "empty file"),
        "random": (_write(tmp_path / "random.bin", bytes(range(7, 250)) * 9), "unknown format"),
        "zeros": (_write(tmp_path / "zeros.pt", bytes(4096)), "zero-filled file"),
        "truncated_zip": (_write(tmp_path / "trunc.pt", raw[: len(raw) // 2]), "truncated or corrupt zip"),
        "text": (_write(tmp_path / "notes.pt", b"just some notes\n" * 20), "unknown format"),
        "lfs_pointer": (_write(tmp_path / "lfs.bin", b"version https://git-lfs.github.com/spec/v1\noid x\n"),
                        "not a PyTorch checkpoint"),
        "gguf": (_write(tmp_path / "m.gguf", b"GGUF" + bytes(60)), "not a PyTorch checkpoint"),
        "foreign_zip": (_zip_other(tmp_path / "other.zip"), "zip without data.pkl"),
        "corrupt_pickle": (_zip_ckpt(tmp_path / "badpkl.pt", b"\x80\x02}q\x00(X\x01"), "corrupt pickle"),
        "no_ckpt_dir": (str(tmp_path / "notes"), "no checkpoint in directory"),  # usage errors (exit 2)
        "empty_dir": (str(tmp_path / "emptydir"), "no checkpoint in directory"),
        "truncated_safetensors": (_write(tmp_path / "t.safetensors",
                                         struct.pack("<Q", len(st_header)) + st_header + bytes(8)),
                                  "truncated safetensors"),
        "json_not_index": (_write(tmp_path / "cfg.json", b'{"hidden_size": 8}'), "not a checkpoint"),
    }


def _zip_other(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "x")
    return str(path)


CASES = ["empty", "random", "zeros", "truncated_zip", "text", "lfs_pointer", "gguf", "foreign_zip",
         "corrupt_pickle", "truncated_safetensors", "json_not_index"]


@pytest.mark.parametrize("case", CASES)
def test_unreadable_input_is_a_report_saying_which(bad, case):
    path, what = bad[case]
    rep = run(path, Options())
    assert [f.code for f in rep.findings] == ["ckpt-unreadable"], [f.title for f in rep.findings]
    f = rep.findings[0]
    assert f.evidence["problem"] == what and f.title.startswith(what)
    assert rep.exit_code() == 1


@pytest.mark.parametrize("case", ["empty", "truncated_zip", "corrupt_pickle"])
def test_unreadable_cli_exit_1_json_no_traceback(bad, case):
    r = run_main("checkpoint-audit", bad[case][0], "--json")
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    assert json.loads(r.stdout)["findings"][0]["code"] == "ckpt-unreadable"


@pytest.mark.parametrize("case", ["no_ckpt_dir", "empty_dir"])
def test_folder_without_checkpoint_is_usage_error_exit_2(bad, case):
    r = run_main("checkpoint-audit", bad[case][0], "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert "no checkpoint in directory" in r.stderr and "Traceback" not in r.stderr


def test_missing_path_is_usage_error_exit_2(tmp_path):
    r = run_main("checkpoint-audit", tmp_path / "nope.pt", "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert "ckpt-unreadable: no such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_broken_symlink_is_usage_error(tmp_path):
    os.symlink(tmp_path / "gone.pt", tmp_path / "link.pt")
    r = run_main("checkpoint-audit", tmp_path / "link.pt")
    assert r.returncode == 2 and "broken symbolic link" in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_is_usage_error_exit_2(tmp_path):
    p = tmp_path / "secret.pt"
    p.write_bytes(b"x" * 10)
    p.chmod(0)
    r = run_main("checkpoint-audit", p)
    assert r.returncode == 2 and "permission denied" in r.stderr and "Traceback" not in r.stderr


def test_permission_denied_path_in_process(monkeypatch, tmp_path):
    """Same as above where tests run as root: open() is made to refuse the file."""
    from typer.testing import CliRunner

    from torchdoctor.cli import app

    p = tmp_path / "secret.pt"
    p.write_bytes(b"x" * 10)
    real_open = os.open

    def fake_open(file, *a, **k):
        if str(file) == str(p):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("os.open", fake_open)
    res = CliRunner().invoke(app, ["checkpoint-audit", str(p)])
    assert res.exit_code == 2
    assert "permission denied" in res.output and "Traceback" not in res.output


def test_missing_shard_names_the_shard(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("ckpt_builders", os.path.join(
        os.path.dirname(__file__), "fixtures", "checkpoint", "builders.py"))
    b = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ckpt_builders", b)
    spec.loader.exec_module(b)
    import torch

    d = tmp_path / "sharded"
    d.mkdir()
    b.write_safetensors({"a": torch.ones(2)}, str(d / "m-00001-of-00002.safetensors"))
    (d / "m.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "m-00001-of-00002.safetensors", "b": "m-00002-of-00002.safetensors"}}))
    rep = run(str(d), Options())
    f = next(f for f in rep.findings if f.code == "ckpt-unreadable")
    assert "m-00002-of-00002.safetensors: shard listed in the index is missing" in f.evidence["parts"][0]
