import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _has_cuda(min_devices: int = 1) -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() >= min_devices
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multi = pytest.mark.skip(reason="needs 2+ CUDA GPUs")
    has1, has2 = None, None
    for item in items:
        if "multigpu" in item.keywords:
            has2 = _has_cuda(2) if has2 is None else has2
            if not has2:
                item.add_marker(skip_multi)
        elif "gpu" in item.keywords:
            has1 = _has_cuda(1) if has1 is None else has1
            if not has1:
                item.add_marker(skip_gpu)


def pytest_collection_finish(session):
    # after every plugin's selection (-m, -k, deselect): plan only the tests that will run
    _plan_fixture_runs(session.items)


def _plan_fixture_runs(items) -> None:
    """The headed fixtures this session checks end to end (tests/test_fixtures.py): the first
    cached fixture run of the session launches them all, two at a time (tests/fixture_runs.py)."""
    import fixture_runs

    for item in items:
        cs = getattr(item, "callspec", None)
        h = cs.params.get("h") if cs else None
        if h is not None and hasattr(h, "rel") and not h.requires and not any(
                m.name == "skip" for m in item.iter_markers()):  # GPU fixtures: one at a time
            fixture_runs.PREFETCH.append(h.rel)


def run_cli(*args, input=None, timeout=300, env=None, cwd=None):
    """Run `python -m torchdoctor ARGS` as a fresh process; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("COLUMNS", "120")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "torchdoctor", *map(str, args)], input=input,
                          capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)


@pytest.fixture
def cli():
    return run_cli
