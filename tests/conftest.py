import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# `nohup make test` (or a runner that ignores SIGHUP) hands the suite SIGHUP ignored, and every
# process it starts inherits that; torchdoctor rightly stays immune to an ignored SIGHUP
# (runner/signals.py), so the tests that send SIGHUP (test_signals, test_interrupt_*) failed, 9 of
# them (session 13). They need the disposition a terminal gives: reset before any lane starts.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

import fixture_lanes  # noqa: E402 - first of ours: its environment snapshot (ENV) is taken before any test runs
import spawn_watch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def _has_cuda(min_devices: int = 1) -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() >= min_devices
    except Exception:
        return False


def _e2e_header(item):
    """The fixture header of an end-to-end fixture test (tests/test_fixtures.py), else None."""
    cs = getattr(item, "callspec", None)
    h = cs.params.get("h") if cs else None
    return h if h is not None and hasattr(h, "rel") else None


def pytest_configure(config):
    # xdist's controller: one folder shared by the workers' fixture runs (tests/fixture_lanes.py),
    # in the environment they inherit, removed when the whole run is done
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        import tempfile

        config._td_shared = tempfile.mkdtemp(prefix="td-fixture-shared-")
        os.environ[fixture_lanes.SHARED_ENV] = f"{os.getpid()}:{config._td_shared}"
        os.environ[fixture_lanes.UNSET_ENV] = ",".join(k for k in ("COLUMNS", "LINES") if k not in os.environ)
    # which tests start Python processes (the fast lane's line): recorded or enforced on request
    if os.environ.get("TD_SPAWN_LOG") or os.environ.get("TD_SPAWN_STRICT"):
        spawn_watch.install()
        config.pluginmanager.register(spawn_watch, "spawn_watch")


def pytest_collection_modifyitems(config, items):
    # the slow lane: end-to-end fixture runs and the tests tests/slow_tests.txt lists (measured:
    # they start Python processes); `make test-fast` leaves them out
    slow, listed = pytest.mark.slow, spawn_watch.slow_nodes()
    for item in items:
        if _e2e_header(item) is not None or spawn_watch.listed_slow(item.nodeid, listed):
            item.add_marker(slow)
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
    # the e2e fixture tests last: their runs go on in a background lane while the others run
    # (tests/fixture_lanes.py); the main thread joins in when it reaches them
    items.sort(key=lambda item: _e2e_header(item) is not None)  # stable: order kept otherwise


def pytest_collection_finish(session):
    # after every plugin's selection (-m, -k, deselect): plan only the tests that will run
    rels = planned_fixture_runs(session.items)
    if os.environ.get("FIXTURE_PLAN_FILE"):  # tests/test_fixture_lanes.py reads what was planned
        Path(os.environ["FIXTURE_PLAN_FILE"]).write_text("\n".join(rels))
    if rels and not session.config.option.collectonly:
        import fixture_runs

        fixture_runs.plan_runs(rels)


def pytest_sessionfinish(session):
    fixture_lanes.SESSION.stop()


def pytest_unconfigure(config):
    shared = getattr(config, "_td_shared", None)
    if shared:
        import shutil

        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop(fixture_lanes.SHARED_ENV, None)
        os.environ.pop(fixture_lanes.UNSET_ENV, None)


def planned_fixture_runs(items) -> list[str]:
    """The headed CPU fixtures this session checks end to end (tests/test_fixtures.py), in test
    order: launched ahead in the background (tests/fixture_runs.py plan_runs). GPU fixtures and
    skipped ones are not: a GPU session (-m "gpu or multigpu") launches no CPU fixture."""
    rels = []
    for item in items:
        h = _e2e_header(item)
        if h is not None and not h.requires and not any(m.name == "skip" for m in item.iter_markers()):
            rels.append(h.rel)
    return rels


def run_cli(*args, input=None, timeout=300, env=None, cwd=None):
    """Run `python -m torchdoctor ARGS` as a fresh process; returns CompletedProcess (text)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("COLUMNS", "120")
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "torchdoctor", *map(str, args)], input=input,
                          capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)


def run_main(*args, input=None, env=None, cwd=None):
    """`torchdoctor ARGS` in this process (``torchdoctor.main.main``, the console entry point),
    returns a CompletedProcess (text) like ``run_cli``. For what does not depend on being a
    separate process — usage errors, exit codes and messages given before any run — at no
    interpreter start (a CLI process costs ~1 s of CPU on the 2-core box, ~3 s more if it
    imports torch; docs/testing.md). An exception torchdoctor lets escape is raised here, where
    the process would have printed a traceback. `env` entries are set (None: removed) for the
    call only, `cwd` likewise."""
    import contextlib
    import io
    import tempfile

    from torchdoctor.main import main

    argv = [*map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_in = dict(os.environ), os.getcwd(), sys.stdin
    code = 0
    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        os.environ.setdefault("COLUMNS", "120")
        if cwd is not None:
            os.chdir(cwd)
        # stdin with a file descriptor (ask reads its fd, bounded): `input` in a temp file, else
        # /dev/null (a test's child gets pytest's stdin, which is not a terminal either)
        stdin = tempfile.TemporaryFile("w+", encoding="utf-8") if input is not None else open(os.devnull)
        if input is not None:
            stdin.write(input)
            stdin.seek(0)
        sys.stdin = stdin
        with stdin, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:  # sys.exit("text"): the interpreter prints it and exits 1
                    code = 1
                    err.write(f"{e.code}\n")
    finally:
        sys.stdin = saved_in
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["torchdoctor", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    return run_cli


# what a command does once its input is checked (tests/test_fail_on_usage.py forbids the same)
WORK = ("torchdoctor.pipeline.run.run_probe", "torchdoctor.pipeline.dist.run_dist",
        "torchdoctor.pipeline.checkpoint.run", "torchdoctor.treat.session.TreatSession.run")


@pytest.fixture
def cli_inproc(monkeypatch):
    """``run_main`` with every command's work forbidden: a usage error must be given before any
    run, and a call that reaches one fails the test (a child's output would not reach
    ``run_main``'s capture, so "the script never ran" is checked here instead)."""
    def forbid(target):
        def ran(*a, **k):
            raise AssertionError(f"{target} ran: the usage error must come before any work")
        monkeypatch.setattr(target, ran)

    for target in WORK:
        forbid(target)
    return run_main
