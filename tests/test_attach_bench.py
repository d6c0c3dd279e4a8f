"""bench/attach_overhead.py's arithmetic (no process): each attached window is set against the
plain window just before it, per mode, and the recommendation names the first mode within 5 %."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "attach_overhead", Path(__file__).resolve().parents[1] / "bench" / "attach_overhead.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def stamps_at(t0: float, t1: float, step_s: float) -> list[float]:
    n = int((t1 - t0) / step_s)
    return [t0 + i * step_s for i in range(n + 1)]


def test_attached_windows_are_paired_with_the_plain_window_before_them():
    # plain 1 ms, blocking 1.02 ms, plain 2 ms (the box got busy), nonblocking 2.2 ms
    stamps = (stamps_at(0, 1, 0.001) + stamps_at(1.5, 2.5, 0.00102) + stamps_at(3, 4, 0.002)
              + stamps_at(4.5, 5.5, 0.0022))
    windows = [("plain", 0, 1.0001), ("blocking", 1.5, 2.5001), ("plain", 3, 4.0001),
               ("nonblocking", 4.5, 5.5001)]
    res = bench.summarise(windows, stamps)
    assert res["modes"]["blocking"]["ratios"] == [1.02] and res["modes"]["blocking"]["within_bound"]
    assert res["modes"]["nonblocking"]["ratios"] == [1.1]
    assert not res["modes"]["nonblocking"]["within_bound"]
    assert bench.recommend(res["modes"]) == "blocking"
    assert [w["kind"] for w in res["windows"]] == ["plain", "blocking", "plain", "nonblocking"]
    assert res["windows"][1]["median_ms"] == 1.02


def test_a_window_without_steps_is_not_a_ratio_and_nothing_within_bound_says_so():
    res = bench.summarise([("plain", 0, 1), ("blocking", 2, 3)], stamps_at(0, 1, 0.001))
    assert res["modes"]["blocking"]["ratios"] == [] and res["modes"]["blocking"]["median_ratio"] is None
    assert bench.recommend(res["modes"]) == "neither within 5 %"
