"""Lone surrogates and hostile names never lose a report (issue 28, items 2, 9, 10, 12).

A lone surrogate (``\\ud800``-``\\udfff``) cannot be encoded as UTF-8: a pickle can hold one, a file
name that is not valid UTF-8 decodes to one (``surrogateescape``). Before the fix, one of them
anywhere in a report made the whole command exit 3 after the work, with no report: a malicious
checkpoint with a surrogate key evaded the audit. Every input is built here.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from torchdoctor.safe import harden_stream, json_visible, visible

PROTO2 = b"\x80\x02"


def _u(s: str) -> bytes:
    """BINUNICODE as pickle writes it: a lone surrogate is stored with surrogatepass."""
    raw = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _system(marker: Path) -> bytes:
    return b"cposix\nsystem\n" + _u(f"touch {marker}") + b"\x85R"


# -- the one escaping point ------------------------------------------------------------------------

def test_visible_and_json_visible_escape_lone_surrogates():
    assert visible("k\ud800v\udfff") == "k\\ud800v\\udfff"
    assert visible("a\udcff\nb", keep_newlines=True) == "a\\udcff\nb"
    visible("\ud800").encode("utf-8")  # encodable: no surrogate left
    doc = json_visible(json.dumps({"k\ud800": "v\udcff"}, ensure_ascii=False))
    doc.encode("utf-8")
    assert json.loads(doc) == {"k\ud800": "v\udcff"}  # faithful: the \u escape decodes to the same string


def test_a_hardened_stream_writes_what_it_cannot_encode_as_an_escape():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8")  # strict, as sys.stdout is
    with pytest.raises(UnicodeEncodeError):
        stream.write("x\ud800\n")
        stream.flush()
    raw.seek(0)
    raw.truncate()
    harden_stream(stream)
    stream.write("x\ud800\n")
    stream.flush()
    assert raw.getvalue() == b"x\\ud800\n"
    harden_stream(io.StringIO())  # no reconfigure: nothing to do, no error


# -- item 2: the unsafe-pickle finding survives any string the file holds --------------------------

def _surrogate_checkpoints(d: Path, marker: Path) -> dict[str, Path]:
    key = PROTO2 + b"}" + _u("model\ud800") + _system(marker) + b"s."
    value = PROTO2 + b"}(" + _u("cmd") + _u("v\udfff") + _u("hook") + _system(marker) + b"u."
    out = {"key.pkl": key, "value.pkl": value}
    paths = {}
    for name, data in out.items():
        (d / name).write_bytes(data)
        paths[name] = d / name
    for name, data in out.items():  # the same pickles inside a torch.save zip
        p = d / name.replace(".pkl", ".pt")
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", data)
            z.writestr("archive/version", "3\n")
        paths[p.name] = p
    return paths


@pytest.mark.parametrize("name", ["key.pkl", "value.pkl", "key.pt", "value.pt"])
def test_malicious_pickle_with_a_lone_surrogate_is_still_flagged(tmp_path, name):
    marker = tmp_path / "MARKER"
    ckpt = _surrogate_checkpoints(tmp_path, marker)[name]
    html = tmp_path / "r.html"
    p = run_cli("checkpoint-audit", "--json", f"--html={html}", ckpt, timeout=120)
    assert p.returncode == 1, p.stderr[-1500:]
    rep = json.loads(p.stdout)
    assert {f["code"]: f["severity"] for f in rep["findings"]}.get("ckpt-unsafe-pickle") == "error"
    assert "ckpt-unsafe-pickle" in html.read_text(encoding="utf-8")
    out = tmp_path / "out"
    p = run_cli("checkpoint-audit", "--out", out, ckpt, timeout=120)  # console, report.txt, report.json
    assert p.returncode == 1, p.stderr[-1500:]
    assert "ckpt-unsafe-pickle" in p.stdout and "internal error" not in p.stderr
    assert "ckpt-unsafe-pickle" in (out / "report.txt").read_text(encoding="utf-8")
    if name.startswith("key"):
        assert "model\\ud800" in p.stdout  # the key shown, its surrogate as an escape
    assert not marker.exists()


# -- item 9: a file name that is not UTF-8, a module named with a surrogate --------------------------

TINY = """\
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _fs_name(folder: Path, raw: bytes) -> str:
    """A path whose name is the raw bytes ``raw`` (str with surrogateescape, as argv gives it)."""
    return os.fsdecode(os.fsencode(str(folder)) + b"/" + raw)


def test_invalid_utf8_script_name_with_out_and_html_keeps_the_report(tmp_path):
    # \xff is not UTF-8 (-> \udcff in argv); ESC[2J would clear the terminal if the name were printed raw
    script = _fs_name(tmp_path, b"tr\xff\x1b[2Jain.py")
    with open(script, "w") as f:
        f.write(TINY)
    out, html = tmp_path / "out", tmp_path / "page.html"
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "checkup", "--json", "--steps", "3", "--out",
                        str(out), f"--html={html}", script], capture_output=True, cwd=tmp_path, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120"))
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 0, err[-2000:]
    rep = json.loads(p.stdout)
    assert rep["target"].endswith("tr\udcff\x1b[2Jain.py")  # JSON keeps the name faithfully
    assert "internal error" not in err
    # item 10: torchdoctor's own "running SCRIPT" line shows the name's bytes as escapes
    running = next(line for line in err.splitlines() if "running" in line)
    assert "tr\\udcff\\x1b[2Jain.py" in running and "\x1b" not in running
    for name in ("report.json", "report.txt", "torchdoctor-report.html"):
        assert (out / name).stat().st_size > 0
    text = (out / "report.txt").read_text(encoding="utf-8")
    assert "tr\\udcff\\x1b[2Jain.py" in text and "\x1b" not in text
    assert "tr\\udcff\\x1b[2Jain.py" in html.read_text(encoding="utf-8")


NAN_SCRIPT = """\
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        # a submodule registered under a name that came from a bytes-decoded config key
        self.add_module("blk\\udcff", nn.Linear(8, 1))

    def forward(self, x):
        h = self.inp(x)
        return getattr(self, "blk\\udcff")(torch.log(h))  # log of negatives: NaN


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_nan_in_a_module_named_with_a_surrogate_is_reported(tmp_path):
    script, out = tmp_path / "surrogate_module.py", tmp_path / "out"
    script.write_text(NAN_SCRIPT)
    p = run_cli("nan", "--steps", "4", "--out", out, script, cwd=tmp_path, timeout=300)  # console and JSON
    assert p.returncode == 1, p.stderr[-2000:]
    assert "internal error" not in p.stderr
    assert "blk\\udcff" in p.stdout  # the module named, its surrogate escaped
    rep = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert any(f["severity"] == "error" and "blk\udcff" in json.dumps(f, ensure_ascii=False)
               for f in rep["findings"]), rep["findings"]


# -- item 10: torchdoctor's own stderr lines escape untrusted text -----------------------------------

def test_script_not_found_and_html_refusal_are_escaped(tmp_path, cli_inproc):
    p = cli_inproc("checkup", tmp_path / "nope\x1b[2J\x9b.py")  # in-process, any run forbidden (conftest)
    assert p.returncode == 2 and "script not found" in p.stderr
    assert "\x1b" not in p.stderr and "\x9b" not in p.stderr and "nope\\x1b[2J\\x9b.py" in p.stderr
    theirs = tmp_path / "notes\x1b]0;pwn\x07.html"
    theirs.write_text("mine")
    script = tmp_path / "t.py"
    script.write_text(TINY)
    p = cli_inproc("checkup", f"--html={theirs}", script)
    assert p.returncode == 2 and "not a torchdoctor report" in p.stderr
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr and "notes\\x1b]0;pwn\\x07.html" in p.stderr
    assert theirs.read_text() == "mine"


RAISING_FN = """\
import torch


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("custom kernel has no backward for this layout")
"""


@pytest.mark.slow
def test_single_function_whose_backward_raises_is_a_finding_not_a_pass(tmp_path):
    (tmp_path / "ops.py").write_text(RAISING_FN)
    p = run_cli("gradcheck", "--json", "ops.py:Boom", "--shape", "4", cwd=tmp_path, timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    rep = json.loads(p.stdout)
    crash = [f for f in rep["findings"] if f["code"] == "script-crashed"]
    assert crash and crash[0]["severity"] == "error", rep["findings"]
    assert "ops.py:11" in json.dumps(crash[0]["evidence"])  # the user's line that raised
    assert "custom kernel has no backward" in json.dumps(crash[0])


# -- item 12: gradcheck FILE.py:Fn refuses a huge file before reading it -----------------------------

def test_huge_function_file_is_refused_before_reading(tmp_path, cli_inproc):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse: reading it took 2.1 GB and 11 s before the bound
    p = cli_inproc("gradcheck", f"{big}:Fn", "--shape", "4")  # in-process, any run forbidden
    assert p.returncode == 2, p.stderr
    assert "over 4 MiB" in p.stderr and "Traceback" not in p.stderr


def test_function_file_bound_is_exact(tmp_path, monkeypatch):
    from torchdoctor.commands import gradcheck as g
    from torchdoctor.errors import DoctorError

    src = b"import torch\nclass F(torch.autograd.Function):\n    pass\n"
    monkeypatch.setattr(g, "MAX_SOURCE_BYTES", len(src))
    f = tmp_path / "ops.py"
    f.write_bytes(src)
    assert g.read_source(f) == src
    f.write_bytes(src + b"#")
    with pytest.raises(DoctorError, match="over"):
        g.read_source(f)
