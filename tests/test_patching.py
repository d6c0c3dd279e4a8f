"""The one install/undo helper for patches (torchdoctor/runner/patching.py)."""

from __future__ import annotations

import threading
import types

import pytest

from torchdoctor.runner.patching import Patches


class Base:
    def hello(self):
        return "base"


class Child(Base):
    def own(self):
        return "own"

    @staticmethod
    def static():
        return "static"


def _tagging(label):
    def make(orig):
        def wrapper(*a, **k):
            return f"{label}({orig(*a, **k)})"
        return wrapper
    return make


def test_install_and_undo_restore_the_original():
    orig = Child.own
    p = Patches()
    w = p.wrap(Child, "own", _tagging("td"))
    assert Child().own() == "td(own)" and Child.own is w and w.__wrapped__ is orig
    p.undo()
    assert Child.own is orig and Child().own() == "own"
    p.undo()  # a second undo does nothing
    assert Child.own is orig


def test_module_attribute_and_missing_attribute():
    mod = types.ModuleType("m")
    mod.f = lambda x: x + 1
    orig = mod.f
    p = Patches()
    p.wrap(mod, "f", lambda o: (lambda x: o(x) * 10))
    assert mod.f(1) == 20
    assert p.wrap(mod, "absent", _tagging("x"), require=False) is None
    with pytest.raises(AttributeError):
        p.wrap(mod, "absent", _tagging("x"))
    p.undo()
    assert mod.f is orig


def test_inherited_attribute_is_deleted_again_not_copied_onto_the_subclass():
    p = Patches()
    p.wrap(Child, "hello", _tagging("td"))
    assert "hello" in vars(Child) and Child().hello() == "td(base)"
    p.undo()
    assert "hello" not in vars(Child) and Child.hello is Base.hello


def test_staticmethod_stays_a_staticmethod():
    raw = vars(Child)["static"]
    p = Patches()
    p.wrap(Child, "static", lambda o: staticmethod(lambda: "td-" + o()))
    assert Child.static() == "td-static"
    p.undo()
    assert vars(Child)["static"] is raw and Child().static() == "static"


def test_someone_patching_on_top_keeps_theirs_and_undo_leaves_it():
    orig = Child.own
    p = Patches()
    mine = p.wrap(Child, "own", _tagging("td"))
    theirs = _tagging("lib")(mine)  # a library wraps after us
    Child.own = theirs
    p.undo()
    assert Child.own is theirs  # not torn off
    assert Child().own() == "lib(td(own))"
    Child.own = orig


def test_double_install_of_a_tag_is_refused():
    orig = Child.own
    p, q = Patches(), Patches()
    first = p.wrap(Child, "own", _tagging("td"), tag="seed")
    assert q.wrap(Child, "own", _tagging("td"), tag="seed") is None  # never wrapped twice
    assert Child().own() == "td(own)" and first._td_patch == "seed"
    other = q.wrap(Child, "own", _tagging("other"), tag="other")  # another tag: allowed
    assert Child().own() == "other(td(own))"
    q.undo()
    assert Child.own is first
    p.undo()
    assert Child.own is orig and other is not None


def test_undo_racing_from_two_threads_restores_once():
    orig = Child.own
    for _ in range(50):
        p = Patches()
        p.wrap(Child, "own", _tagging("td"))
        ts = [threading.Thread(target=p.undo) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert Child.own is orig and len(p) == 0
