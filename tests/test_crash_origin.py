"""An exception raised by torchdoctor's own code inside the user's is torchdoctor's internal
error, never ``script-crashed`` (issue 27 item 2).

This file plays the user's code (it is not under the torchdoctor package); the functions called
below from it are torchdoctor's own.
"""

from __future__ import annotations

import sys
import types

import pytest

from torchdoctor.evidence import Evidence
from torchdoctor.runner.frames import torchdoctor_origin
from torchdoctor.runner.patching import Patches, passthrough


def _tb_of(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001
        return sys.exc_info()[2]
    raise AssertionError("did not raise")


def _user_calls_torchdoctor_code_that_raises():
    from torchdoctor.memory.layouts import Skipped

    Skipped().as_dict.__func__(None)  # AttributeError raised inside torchdoctor/memory/layouts.py


def test_an_exception_raised_in_torchdoctor_code_called_from_the_user_is_ours():
    origin = torchdoctor_origin(_tb_of(_user_calls_torchdoctor_code_that_raises))
    assert origin is not None
    assert origin[0].endswith("torchdoctor/memory/layouts.py") and origin[2] == "as_dict"


def test_the_users_own_exception_is_not_ours():
    def user():
        raise ValueError("bad shape")

    assert torchdoctor_origin(_tb_of(user)) is None


def test_an_error_of_what_the_user_called_through_our_wrapper_is_the_users(monkeypatch):
    import random

    from torchdoctor.instruments.repro.rng_draws import Counted
    from torchdoctor.runner.patching import PASSTHROUGH_CODES

    inst = types.SimpleNamespace(live=False, pid=0)
    code = Counted.__call__.__code__
    monkeypatch.setattr("torchdoctor.runner.patching.PASSTHROUGH_CODES", PASSTHROUGH_CODES - {code})
    from torchdoctor.runner import patching

    bare = Counted(random.choice, "python", "random.choice", inst)  # not installed as a patch
    origin = torchdoctor_origin(_tb_of(lambda: bare([])))  # IndexError raised in random.py
    assert origin is not None and origin[2] == "__call__"  # without the mark it would be ours
    p = Patches()
    p.wrap(random, "choice", lambda o: Counted(o, "python", "random.choice", inst))
    try:
        assert code in patching.PASSTHROUGH_CODES
        tb = _tb_of(lambda: random.choice([]))  # the user's empty sequence, through our patch
    finally:
        p.undo()
    assert torchdoctor_origin(tb) is None


def test_a_dispatch_mode_running_the_users_op_passes_its_error_through():
    torch = pytest.importorskip("torch")
    from torchdoctor.memory.sites import DispatchTracker

    tr = DispatchTracker()
    assert tr.start(1)
    try:
        tb = _tb_of(lambda: torch.mm(torch.ones(2, 3), torch.ones(2, 3)))  # the user's shape error
    finally:
        tr.stop()
    assert torchdoctor_origin(tb) is None


def test_passthrough_marks_functions_and_callable_objects():
    from torchdoctor.runner.patching import PASSTHROUGH_CODES

    class Counted:
        def __call__(self):
            return 1

    def f():
        return 2

    passthrough(f)
    passthrough(Counted())
    assert f.__code__ in PASSTHROUGH_CODES and Counted.__call__.__code__ in PASSTHROUGH_CODES


def _crashed(exception: dict) -> Evidence:
    return Evidence.from_events([], meta={"probe": "memory", "argv": ["train.py"]},
                                result={"outcome": "crash", "exit_code": 1, "steps": 0,
                                        "exception": exception})


def test_the_crash_rule_reports_ours_as_internal_error_not_script_crashed():
    from torchdoctor.rules.crash import crash

    exc = {"type": "NotImplementedError", "message": "Cannot access storage of SparseTensorImpl",
           "traceback": [["/work/train.py", 58, "forward", True],
                         ["/x/torchdoctor/memory/saved.py", 51, "_pack", False]],
           "user_frame": {"file": "/work/train.py", "line": 58, "function": "forward", "code": ""},
           "torchdoctor_frame": {"file": "/x/torchdoctor/memory/saved.py", "line": 51, "function": "_pack"}}
    out = crash(_crashed(exc))
    assert [f.code for f in out] == ["internal-error"]
    f = out[0]
    assert f.severity == "error" and "torchdoctor" in f.title and "not at fault" in f.title
    assert "_pack" in f.evidence["raised_in"] and "Fix the error at the line shown" not in f.fix
    plain = dict(exc)
    del plain["torchdoctor_frame"]
    assert [f.code for f in crash(_crashed(plain))] == ["script-crashed"]


def test_the_harness_records_the_torchdoctor_frame_of_a_crash():
    from torchdoctor.runner.harness import _exception_record

    try:
        _user_calls_torchdoctor_code_that_raises()
    except AttributeError as e:
        rec = _exception_record(e)
    assert rec["torchdoctor_frame"]["function"] == "as_dict"
    assert rec["user_frame"]["function"] == "_user_calls_torchdoctor_code_that_raises"
    try:
        raise KeyError("the user's")
    except KeyError as e:
        assert "torchdoctor_frame" not in _exception_record(e)
