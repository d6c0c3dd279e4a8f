"""memory-growth when the site window watched a fill that stopped (synthetic evidence).

A length curriculum (each step's input larger, nothing kept) in the same run as a cache that
fills during the first 12 steps and is then only read (tests/fixtures/scripts/memory/
curriculum_and_cache.py). The site window ran at steps 10-13, while the cache filled: it named
the cache line (1 MiB/step kept) and so the curriculum's +96 KiB/step of bigger inputs read as a
leak, a warning naming the cache. The cache's keeping stopped (memory after the window rises a
tenth of it), and the activations saved for backward grow with the batch: no memory-growth.

Pure and fast: no torch, no child process.
"""

from __future__ import annotations

from torchdoctor.evidence import Evidence
from torchdoctor.rules.memory import memory_growth

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

WINDOW = (10, 13)
CACHE = {"site": "train.py:20", "function": "<module>", "bytes": 3 * MiB, "count": 3,
         "bytes_per_step": MiB, "called_from": []}


def run(**kw):
    return Evidence.from_events(events(**kw))


def events(per_step=96 * KiB, fill_steps=12, act_per_step=500 * KiB, sites=(CACHE,), leak=0, n=40):
    """A run's events: heap at step ends rising ``per_step`` (the curriculum's bigger inputs)
    plus 1 MiB a step while the cache fills, plus ``leak`` bytes a step kept; activations at the
    start of backward rising ``act_per_step``; the site window at steps 10-13 naming ``sites``."""
    evs = [{"kind": "mem_info", "host": {"total": 32 * GiB, "available": 16 * GiB},
            "baseline_heap": 100 * MiB}]
    evs += [{"kind": "step", "step": s, "wall_s": 0.01} for s in range(1, n + 1)]
    lo, hi = WINDOW
    for s in range(1, n + 1):
        heap = 100 * MiB + s * (per_step + leak) + min(s, fill_steps) * MiB
        e = {"kind": "mem", "step": s, "heap": heap, "rss": 300 * MiB,
             "bwd": {"heap": heap, "cuda": None, "act": 600 * KiB + s * act_per_step}}
        if lo <= s <= hi:
            e["heap"] += 180 * KiB  # the window's own bookkeeping
            e["window"] = True
        evs.append(e)
    kept = sum(x["bytes"] for x in sites)
    evs.append({"kind": "mem_sites", "steps": list(WINDOW), "graph_growth": [],
                "tensor_sites": list(sites), "tensor_survivor_bytes": kept,
                "cpu_tensor_bytes_per_step": round(kept / 3 + per_step), "python_sites": []})
    return evs


def test_a_curriculum_after_a_cache_that_filled_in_the_window_is_not_growth():
    assert memory_growth(run()) == []


def test_the_same_curriculum_without_the_fill_was_already_quiet_and_still_is():
    # growing_batch.py's case: the window watched the bigger inputs, nothing survived
    assert memory_growth(run(fill_steps=0, sites=())) == []


def test_growth_the_batch_does_not_explain_is_reported_without_naming_the_stopped_cache():
    # constant batch (activations flat): the +96 KiB/step is not bigger steps; the cache stopped
    # filling at step 12, so it does not name the growth (and nothing else does: at most info)
    [f] = memory_growth(run(act_per_step=0))
    assert "train.py:20" not in f.title
    assert "growing_sites" not in f.evidence
    assert f.evidence["stopped_sites"][0].startswith("train.py:20: kept +1 MiB/step")
    assert f.severity == "info"


def test_a_site_that_keeps_keeping_is_a_leak_even_in_a_curriculum():
    # the window's site keeps 256 KiB/step and memory after the window rises as fast: not stopped
    site = {**CACHE, "bytes": 3 * 256 * KiB, "bytes_per_step": 256 * KiB}
    [f] = memory_growth(run(per_step=0, fill_steps=0, leak=256 * KiB, sites=(site,)))
    assert f.severity in ("warning", "error")
    assert f.title.endswith("growing site: train.py:20")
    assert "stopped_sites" not in f.evidence


def test_a_leak_beside_the_stopped_cache_is_reported_and_names_the_leak():
    leak = {"site": "train.py:31", "function": "<module>", "bytes": 3 * 128 * KiB, "count": 3,
            "bytes_per_step": 128 * KiB, "called_from": []}
    [f] = memory_growth(run(leak=128 * KiB, sites=(CACHE, leak)))
    assert f.severity in ("warning", "error")
    assert f.title.endswith("growing site: train.py:31")
    assert f.evidence["stopped_sites"][0].startswith("train.py:20")


def checkup_run(passing_per_step, **kw):
    """The same run as checkup measures it: no activations (``bwd`` not read), the window's
    passing tensors (each step's batch and outputs, freed by the next step) growing
    ``passing_per_step``."""
    out = []
    for e in events(**kw):
        if e.get("kind") == "mem":
            e = {k: v for k, v in e.items() if k != "bwd"}
        elif e.get("kind") == "mem_sites" and passing_per_step is not None:
            e = {**e, "cpu_step_tensor_growth": passing_per_step}
        out.append(e)
    return Evidence.from_events(out)


def test_checkup_reads_the_windows_passing_tensors_when_activations_are_not_measured():
    # regression: checkup gave memory-growth@info on curriculum_and_cache.py (no `act` series)
    assert memory_growth(checkup_run(99 * KiB)) == []


def test_checkup_without_passing_tensor_growth_still_reports_the_growth():
    # the passing tensors stayed the same size: the +96 KiB/step is not bigger steps
    [f] = memory_growth(checkup_run(0))
    assert f.evidence["stopped_sites"][0].startswith("train.py:20")
    [f] = memory_growth(checkup_run(None))  # an older window without the field
    assert "growing_sites" not in f.evidence
