"""The instrument package's shape: one contract (instruments/base.py), families in sub-packages that
discovery walks, and the shipped recording context (instruments/testing.py) the tests drive
instruments with. No torch, no child process."""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest

from torchdoctor.instruments import all_instruments, base
from torchdoctor.instruments.testing import RecordingContext
from torchdoctor.runner.context import HarnessContext

PKG = Path(__file__).resolve().parent.parent / "torchdoctor" / "instruments"
TESTS = Path(__file__).resolve().parent
TOP = {"__init__.py", "base.py", "testing.py", "_sites.py"}  # the package's own modules


def _registering_modules() -> set[str]:
    """Modules whose source registers a class (``@register``), by dotted name."""
    out = set()
    for p in PKG.rglob("*.py"):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        if any(isinstance(d, ast.Name) and d.id == "register" for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef) for d in n.decorator_list):
            rel = p.relative_to(PKG.parent.parent).with_suffix("")
            out.add(".".join(rel.parts))
    return out


def test_discovery_finds_every_registered_class_in_the_sub_packages():
    found = {c.__module__ for c in all_instruments().values()}
    assert found == _registering_modules()
    assert all(m.count(".") == 3 for m in found), "an instrument outside a family sub-package"
    # TORCHDOCTOR_DISABLE=name and instrument_error name the instrument: its module has that name
    assert {n: c.__module__.rpartition(".")[2] for n, c in all_instruments().items()} == \
        {n: n for n in all_instruments()}


def test_the_top_of_the_package_holds_only_the_contract_the_double_and_shared_helpers():
    assert {p.name for p in PKG.glob("*.py")} == TOP
    for d in (p for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (d / "__init__.py").is_file(), f"{d.name}/ is not a package: discovery skips it"


def _plugin_package(root: Path, name: str) -> None:
    (root / name / "fam").mkdir(parents=True)
    (root / name / "__init__.py").write_text("SEEN = []\n")
    (root / name / "top.py").write_text(f"import {name}\n{name}.SEEN.append('top')\n")
    (root / name / "fam" / "__init__.py").write_text("")
    (root / name / "fam" / "leaf.py").write_text(f"import {name}\n{name}.SEEN.append('leaf')\n")


@pytest.mark.parametrize("recursive, seen", [(False, ["top"]), (True, ["leaf", "top"])])
def test_recursive_discovery_imports_the_modules_of_sub_packages(tmp_path, monkeypatch, recursive, seen):
    import importlib

    from torchdoctor.discovery import import_submodules

    name = f"plug_{recursive}".lower()
    _plugin_package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = importlib.import_module(name)
    try:
        import_submodules(name, pkg.__path__, recursive=recursive)
        assert pkg.SEEN == seen  # depth first, in name order: fam/leaf before top
    finally:
        for m in [m for m in sys.modules if m.split(".")[0] == name]:
            del sys.modules[m]


def test_the_core_dispatches_the_contracts_callbacks():
    from torchdoctor.runner import core

    assert core.CALLBACKS is base.CALLBACKS
    assert all(hasattr(base.Instrument, cb) for cb in base.CALLBACKS)


# ---- the recording context ------------------------------------------------------------------------
def test_the_recording_context_is_the_harness_context_keeping_evidence_in_memory():
    ctx = RecordingContext("memory", {"steps": 3})
    assert isinstance(ctx, HarnessContext) and ctx.probe == "memory" and ctx.options == {"steps": 3}
    ctx.emit("mem", step=1, heap=10)
    ctx.emit("mem", step=2, heap=12)
    ctx.emit("mem_end", peak=12)
    assert [e["step"] for e in ctx.of("mem")] == [1, 2]
    assert ctx.last("mem_end") == {"kind": "mem_end", "peak": 12}
    with pytest.raises(LookupError, match="mem_end"):
        ctx.last("nonfinite")
    ctx.request_stop("first")
    ctx.request_stop("second")
    assert ctx.stop_reason == "first"


def test_evidence_that_is_not_json_is_refused_unless_asked_otherwise():
    with pytest.raises(TypeError):
        RecordingContext().emit("x", value=object())
    loose = RecordingContext(strict_json=False)
    loose.emit("x", value=object())
    assert len(loose.events) == 1


def test_the_owner_thread_is_the_one_that_made_the_context():
    ctx = RecordingContext()
    answers = {}

    def other():
        answers["before"] = ctx.in_owner_thread()
        ctx.train_in_this_thread()
        answers["after"] = ctx.in_owner_thread()

    assert ctx.in_owner_thread() and ctx.in_owner_process()
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert answers == {"before": False, "after": True}
    assert not ctx.in_owner_thread()  # the clock adopted the other thread


def test_models_optimizers_and_artifacts(tmp_path):
    class Thing:  # weak-referenceable, like a module or an optimizer
        pass

    model, opt = Thing(), Thing()
    ctx = RecordingContext("checkup", run_dir=tmp_path / "run", out_dir=tmp_path / "out",
                           models=(model,), optimizers=(opt,))
    ctx.saw_model(model)  # seen again: still one
    assert ctx.models() == [model] and ctx.models_seen == 1 and ctx.optimizers == [opt]
    assert ctx.run_dir.is_dir() and ctx.out_dir == tmp_path / "out"
    f = ctx.run_dir / "trace.json"
    f.write_text("{}")
    ctx.emit("artifact", name="trace", path=str(f))
    assert ctx.artifacts() == {"trace": f}


def test_a_context_without_a_run_dir_removes_its_own():
    ctx = RecordingContext()
    d = ctx.run_dir
    assert d.is_dir()
    ctx.close()
    assert not d.exists()


def test_tests_drive_instruments_with_the_recording_context_not_their_own_double():
    # a class of a test module with the context's methods is a fake harness context
    marks = ("def in_owner_thread(self", "def emit(self, kind")
    own = [p.name for p in sorted(TESTS.glob("test_*.py"))
           if p.name != Path(__file__).name and any(m in p.read_text(encoding="utf-8") for m in marks)]
    assert not own, f"use torchdoctor.instruments.testing.RecordingContext in: {own}"
