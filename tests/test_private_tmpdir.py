"""Each run gets a private TMPDIR, removed with the run (issue 28, left from round 2).

torch's temporaries (DataLoader workers' ``pymp-*``, inductor's ``torchinductor_<user>`` and its
compiler's ``cc*.s``, torchrun's ``torchelastic_*``) and a script's own scratch folders used to stay
in the user's temp folder after every run, and torchdoctor runs a script many times. Here the
script leaves such things on purpose, in the temp folder it is given, and a stop by ``--steps``
ends it before any clean-up it might have had.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_cli
from torchdoctor.runner import privtmp

LEAVES = """\
import os
import stat
import sys
import tempfile

import torch

# the scratch a training script makes and never removes, as torch's own temporaries are left
scratch = tempfile.mkdtemp(prefix="pymp-")
fd, asm = tempfile.mkstemp(prefix="cc", suffix=".s")
os.close(fd)
cache = os.path.join(tempfile.gettempdir(), "torchinductor_user", "fx_graph_cache")
os.makedirs(cache)
os.chmod(os.path.dirname(cache), stat.S_IRUSR | stat.S_IXUSR)  # a read-only folder in there too
with open(sys.argv[1], "w") as f:
    f.write(tempfile.gettempdir())

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture
def base() -> Path:
    """A short folder (pytest's tmp_path is deeper than privtmp.MAX_PATH allows under the run dir)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="td-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def systmp(base: Path) -> Path:
    d = base / "t"
    d.mkdir()
    return d


def test_a_run_leaves_nothing_in_the_users_temp_folder(tmp_path, systmp):
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    seen = tmp_path / "seen.txt"
    p = run_cli("checkup", "--steps", "3", script, seen, env={"TMPDIR": str(systmp)}, cwd=tmp_path, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    given = Path(seen.read_text())
    assert given.name == "tmp" and given.parent.name.startswith("torchdoctor-run-")  # private, under the run dir
    assert given.parent.parent == systmp
    assert sorted(os.listdir(systmp)) == []  # the run dir and everything the script left: gone
    # under --out the run dir stays and only its tmp/ goes: the same privtmp.make/remove (unit below)


def test_a_deep_run_dir_gets_a_short_temp_folder_for_unix_sockets(base, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    deep = base / ("d" * 80) / "run"
    deep.mkdir(parents=True)
    t = privtmp.make(deep)
    try:
        assert t.parent == base and t.name.startswith("torchdoctor-tmp-")  # the parent's temp folder
        assert len(os.fsencode(str(t / "pymp-abcdefgh" / "listener-abcdefgh"))) < 107
    finally:
        privtmp.remove(t)
    assert not t.exists()
    short = base / "r"
    short.mkdir()
    t = privtmp.make(short)
    assert t == short.resolve() / "tmp" and oct(t.stat().st_mode & 0o777) == "0o700"
    (t / "x").mkdir()
    (t / "x").chmod(0o500)
    privtmp.remove(t)
    assert not t.exists()


INDUCTOR = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).cuda()
model = torch.compile(model)  # inductor: its cache, Triton kernels and compiler temporaries
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(6):
    loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.gpu
def test_inductor_on_cuda_leaves_nothing_in_the_temp_folder(tmp_path, systmp):
    """compile (the compiled run, then the eager run): torchinductor_<user>, Triton's and the C++
    compiler's temporaries go with each run's private TMPDIR."""
    script = tmp_path / "compiled.py"
    script.write_text(INDUCTOR)
    p = run_cli("compile", "--steps", "6", script, env={"TMPDIR": str(systmp)}, cwd=tmp_path, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    assert os.listdir(systmp) == []
