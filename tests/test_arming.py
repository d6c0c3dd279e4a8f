"""Which instruments each probe arms: derived from what the rules need, frozen here.

The table was computed on the code before the arming was derived (each instrument then listed
its probes by hand): deriving it from the rules' ``needs`` and the instruments' ``produces``
must arm exactly the same instruments, probe by probe. ``run`` is armed for every script run
(the harness adds it to the probe's own, see ``runner/harness.py``), ``memory-sampler`` is the
bench's sampler-only probe (bench/memory_overhead.py), ``nan`` is also the probe of checkup's
NaN replay (pipeline/followups_nan.py).
"""

import pytest

from torchdoctor.pipeline.registry import instruments_for

ARMED = {
    # cpu: rank-straggler tells a rank's own extra work from its wait for a CPU on a loaded host
    # (issue 27, the Lightning DDP run of session 9): two clock reads per step, /proc twice a run
    # child_processes: processes the script starts itself (mnist_hogwild, mp.spawn; session 13):
    # one wrapper call per process started
    "run": ["dist_steps", "dist_collectives", "dist_sampler", "child_processes", "cpu", "crashctx",
            "training_anomaly"],
    "checkup": ["data_source", "training_grads", "training_modes", "memory_sampler", "moved",
                "nan_monitor", "cpu", "memory_grad_eval", "seeding", "save_audit", "dynamo_counters"],
    "profile": ["data_source", "moved", "cpu", "profiler_window", "flop_count"],  # + the yardstick
    "memory": ["memory_detail", "memory_sampler", "memory_grad_eval"],
    "nan": ["training_grads", "training_modes", "nan_monitor", "nan_capture"],
    "memory-sampler": ["memory_sampler"],
    "gradcheck": ["autograd_capture"],
    "compile": ["dynamo_diag", "dynamo_counters"],
    # `repro`: the save audit (rules/checkpoint_saves.py) is one of its rules; the comparison of
    # the two runs (repro_compare) is built in the parent: its trials arm the fingerprint,
    # rng_draws, fingerprint_ops and fingerprint_determinism instruments by the variations'
    # needs (reprocheck/flow.py REPRO_NEEDS)
    "repro": ["save_audit"],
    "ranks": [],  # judged on the merged ranks' evidence: the instruments are armed by "run"
}


@pytest.mark.parametrize("probe", sorted(ARMED))
def test_each_probe_arms_the_instruments_it_armed_before(probe):
    assert [c.name for c in instruments_for(probe)] == ARMED[probe]


def test_an_unknown_probe_arms_nothing():
    assert instruments_for("no-such-probe") == []


@pytest.mark.parametrize("probe", ["checkup", "profile", "memory", "nan", "memory-sampler", "gradcheck",
                                   "compile"])
def test_the_child_arms_from_the_parents_needs_what_the_probe_and_run_arm(probe):
    """launch.py writes ``armed_needs(probe)`` into meta.json; the child harness arms from those
    kinds without loading the rules: the same instruments as the probe's plus run's."""
    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.harness import _armed

    from_parent = [type(i).name for i in _armed(sorted(armed_needs(probe)))]
    assert sorted(from_parent) == sorted(set(ARMED[probe]) | set(ARMED["run"]))
    both = instruments_for(probe) + [c for c in instruments_for("run") if c not in instruments_for(probe)]
    assert from_parent == [c.name for c in sorted(both, key=lambda c: (c.priority, c.name))]


def test_a_run_launched_with_its_needs_arms_its_instruments(tmp_path):
    """End to end through launch(): meta.json carries the needs, the child arms from them."""
    import json

    from torchdoctor.pipeline.registry import armed_needs
    from torchdoctor.runner.launch import launch

    script = tmp_path / "s.py"
    script.write_text("print('ok')\n")
    launch(tmp_path / "run", "memory", [str(script)], options={}, timeout=60,
           needs=armed_needs("memory"), show_progress=False)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["needs"] == sorted(armed_needs("memory"))
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e.get("kind") == "mem_info" for e in events)  # the memory sampler was armed


def test_an_instrument_declares_what_it_produces_not_the_probes_that_arm_it():
    from torchdoctor.instruments.base import Instrument, register

    class Old(Instrument):
        name = "test_old_style"
        probes = frozenset({"checkup"})

    with pytest.raises(ValueError, match="produces"):
        register(Old)

    class Mute(Instrument):
        name = "test_mute"

    with pytest.raises(ValueError, match="produces"):
        register(Mute)
