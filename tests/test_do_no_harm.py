"""First, do no harm: a script that snapshots or saves its model runs under every probe as it
runs plainly (issue 13 item 1).

Hooks torchdoctor registered on the user's root modules were bound methods of instruments
(which hold the evidence file, ``torch`` itself, locks): ``copy.deepcopy(model)`` (EMA, best
model) and ``torch.save(model)`` raised inside the script, which torchdoctor then reported as
the user's crash. Now hooks on user modules are :class:`UserHook` objects that
``nn.Module.__getstate__`` leaves out while the run lasts, and modules whose class copies its
state otherwise get no hook at all.
"""

from __future__ import annotations

import copy
import pickle
import pickletools
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_nan_fixtures import run_inprocess

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "scripts" / "run" / "snapshots.py"
PROBES = ["checkup", "profile", "memory", "nan", "dist"]


def _globals_of(path: Path) -> set[str]:
    """GLOBAL / STACK_GLOBAL names in a torch.save zip's data.pkl (nothing is run)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        data = z.read(name)
    names, strings = set(), []
    for op, arg, _pos in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.add(".".join(strings[-2:]))
    return names


def _load_plainly(path: Path) -> subprocess.CompletedProcess:
    """torch.load of the whole model in a Python that cannot import torchdoctor."""
    code = ("import sys; sys.modules['torchdoctor'] = None\n"
            "import torch\n"
            f"m = torch.load({str(path)!r}, weights_only=False)\n"
            "hooks = sum(len(s._forward_hooks) + len(s._forward_pre_hooks) for s in m.modules())\n"
            "assert hooks == 0, hooks\n"
            "print(m(torch.zeros(2, 8)).shape)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tempfile.gettempdir())


@pytest.mark.parametrize("mode", ["with-lock-class", "--no-lock-class"])
@pytest.mark.parametrize("probe", PROBES)
def test_snapshots_and_saves_work_under_every_probe(probe, mode, tmp_path):
    ev = run_inprocess(probe, SCRIPT, (str(tmp_path), "12", mode), {"steps": 0})
    assert ev.result["outcome"] == "exit", ev.result.get("exception")
    assert not ev.of("instrument_error"), ev.of("instrument_error")
    assert ev.result["steps"] == 12
    names = _globals_of(tmp_path / "whole.pt")
    assert not any("torchdoctor" in n for n in names), names


def test_saved_whole_model_loads_in_a_plain_process(tmp_path):
    ev = run_inprocess("checkup", SCRIPT, (str(tmp_path), "8", "--no-lock-class"), {"steps": 0})
    assert ev.result["outcome"] == "exit", ev.result.get("exception")
    r = _load_plainly(tmp_path / "whole.pt")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch.Size([2, 1])" in r.stdout


@pytest.mark.slow
def test_cli_checkup_of_the_snapshot_script_is_clean():
    from fixture_runs import run_fixture

    r = run_fixture("run/snapshots.py", "checkup --steps 0 -- {tmp} 10")  # the session's run
    assert r.returncode == 0, r.stderr[-3000:]
    assert "snapshots ok" in r.stderr
    bad = [f for f in r.report["findings"] if f["severity"] in ("error", "warning")
           and f["code"] != "cpu-oversubscribed"]  # the shared 2-core box is often loaded
    assert not bad, bad


# ---- the pieces --------------------------------------------------------------------------
class _Owner:
    """Holds what an instrument holds: a file (neither deepcopy nor pickle can copy it)."""

    def __init__(self):
        self.f = tempfile.TemporaryFile()
        self.calls = 0

    def hook(self, module, args, output):
        self.calls += 1


def test_user_hook_never_copies_its_instrument():
    import torch

    from torchdoctor.runner.userhooks import UserHook, install_state_filter, register_on

    owner = _Owner()
    m = torch.nn.Linear(2, 2)
    undo = install_state_filter()
    try:
        handle, hook = register_on(m, "forward", owner.hook, always_call=True)
        m(torch.zeros(1, 2))
        assert owner.calls == 1
        c = copy.deepcopy(m)
        assert not c._forward_hooks and not c._forward_hooks_always_called
        assert len(m._forward_hooks) == 1 and len(m._forward_hooks_always_called) == 1
        back = pickle.loads(pickle.dumps(m))
        assert not back._forward_hooks
        assert b"torchdoctor" not in pickle.dumps(m)
        c(torch.zeros(1, 2))
        assert owner.calls == 1  # the copy is not instrumented
    finally:
        undo()
    # a hook that travels anyway (a dict pickled as it is) is a no-op that needs no torchdoctor
    d = copy.deepcopy({"h": hook})
    assert d["h"](m, (), None) is None and owner.calls == 1
    blob = pickle.dumps({"h": hook})
    assert b"torchdoctor.runner" not in blob
    assert pickle.loads(blob)["h"](m, (), None) is None
    hook.detach()
    m(torch.zeros(1, 2))
    assert owner.calls == 1  # detached at teardown: a no-op
    handle.remove()
    assert torch.nn.Module.__getstate__.__qualname__ == "Module.__getstate__"
    assert not getattr(torch.nn.Module.__getstate__, "_td_patch", None)
    assert not hasattr(torch.nn.Module.__getstate__, "__wrapped__")  # the original is back


def test_modules_that_copy_their_own_state_get_no_hook():
    import torch

    from torchdoctor.runner.userhooks import hookable

    assert hookable(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert not hookable(torch.nn.LSTM(2, 2))  # RNNBase.__getstate__ copies __dict__ itself
