"""treat on a CUDA GPU (skipped without one): the acceptance numbers of issue 16 on an H100.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_treat_gpu.py -s

Each test runs one fixture of tests/fixtures/scripts/treat/ under its header command (--json) and
prints its trials; the expected verdicts are asserted."""

from __future__ import annotations

import pytest

from fixture_runs import run_fixture

pytestmark = pytest.mark.gpu


def _trials(rel: str) -> tuple[dict, dict[str, dict]]:
    run = run_fixture(rel)
    r = run.report
    assert "trials" in r["metrics"], run.stderr[-3000:]
    by = {e["name"]: e for e in r["metrics"]["trials"]}
    for e in r["metrics"]["trials"]:
        print(f"\n{rel}: {e['name']}: {e['verdict']} ({e['reason']}) "
              f"{e.get('baseline_step_ms')} -> {e.get('treated_step_ms')} ms, "
              f"peak {e.get('peak_memory_before')} -> {e.get('peak_memory_after')} "
              f"[{e.get('peak_memory_kind')}], loss {e.get('loss_ok')} {e.get('loss_max_rel_diff')}")
    return r, by


def _nothing_adopted_fails_the_loss_check(r: dict) -> None:
    bad = [e["name"] for e in r["metrics"]["trials"] if e["verdict"] == "adopt" and e["loss_ok"] is False]
    assert not bad, bad


def test_fp32_matmuls_adopt_tf32_or_bf16_autocast_at_least_1_5x():
    r, by = _trials("treat/gpu_fp32_matmul.py")
    fast = [e for e in (by["tf32"], by["bf16-autocast"]) if e["verdict"] == "adopt"]
    assert fast and max(e["speedup"] for e in fast) >= 1.5, [(e["name"], e["speedup"]) for e in fast]
    assert all(e["loss_ok"] is True for e in fast)
    _nothing_adopted_fails_the_loss_check(r)
    tf = by["tf32"]
    if tf["verdict"] == "adopt":
        assert "torch.backends.cuda.matmul.allow_tf32 = True" in tf["fix"]
        assert tf["where"] == ["gpu_fp32_matmul.py:9"]  # after `import torch`


def test_pageable_copies_get_pin_memory_measured():
    r, by = _trials("treat/gpu_pageable.py")
    e = by["pin-memory"]
    assert e["verdict"] in ("adopt", "noise", "reject"), e["reason"]
    assert e["rounds"] == {"baseline": 2, "treated": 2} and e["speedup"] is not None
    assert e["loss_ok"] is True
    if e["verdict"] == "adopt":
        assert "gpu_pageable.py:16" in e["where"]  # the DataLoader
    _nothing_adopted_fails_the_loss_check(r)


def test_fragmentation_adopts_expandable_segments_for_the_reserved_memory_saved():
    r, by = _trials("treat/gpu_fragmentation.py")
    from torchdoctor.treat.plan import fragmented

    e = by["expandable-segments"]
    before = e["before"]  # the baseline's peaks: the automatic plan would choose this trial
    assert fragmented({"allocated": before["peak_memory"], "reserved": before["peak_reserved"]})
    assert e["verdict"] == "adopt" and e["peak_memory_kind"] == "cuda-reserved"
    assert e["peak_memory_after"] < e["peak_memory_before"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in e["fix"]


def test_a_healthy_bf16_script_adopts_nothing_that_fails_the_loss_check():
    r, by = _trials("treat/gpu_healthy_bf16.py")
    assert by["bf16-autocast"]["verdict"] == "skipped"
    assert by["bf16-autocast"]["reason"] == "the script already runs its forward under autocast"
    assert by["fused-optimizer"]["reason"] == "fused=True already"
    _nothing_adopted_fails_the_loss_check(r)
