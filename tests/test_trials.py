"""The trials layer (torchdoctor/trials): comparisons on numbers, and real bounded runs."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

from torchdoctor.trials import (BASELINE, Trials, Variation, loss_drift, median, noise_band,
                                round_medians, speedup)
from torchdoctor.trials.compare import MIN_NOISE, spread

SCRIPT = textwrap.dedent("""\
    import os, torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    if os.environ.get("TRIAL_CRASH"):
        raise RuntimeError("planted failure")
    scale = float(os.environ.get("TRIAL_SCALE", "1"))
    print("training starts", flush=True)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x) * scale, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


def test_medians_spread_speedup_and_noise_band():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([]) is None
    assert round_medians([[10, 12, 11], [], [20]]) == [11, 20]
    assert spread([10.0]) == 0.0 and spread([]) is None
    assert spread([9.0, 10.0, 11.0]) == pytest.approx(0.2)
    assert speedup([10.0, 10.4], [5.0, 5.2]) == pytest.approx(10.2 / 5.1)
    assert speedup([10.0], []) is None
    assert noise_band([10.0, 10.01], [5.0]) == MIN_NOISE  # quieter than the floor
    assert noise_band([9.0, 11.0], [5.0, 5.1]) == pytest.approx(0.2)


def test_loss_drift_is_relative_and_non_finite_on_one_side_is_infinite():
    assert loss_drift([1.0, 2.0, None], [1.0, 2.2, 5.0]) == (pytest.approx(0.2 / 2.2), 2)
    assert loss_drift([1.0, "nan"], [1.0, "nan"]) == (0.0, 2)  # both non-finite: same
    worst, n = loss_drift([1.0, 2.0], [1.0, "inf"])
    assert math.isinf(worst) and n == 2
    assert loss_drift([], [1.0]) == (None, 0)


def test_runs_under_a_variation_measure_steps_losses_memory_and_failures(tmp_path: Path, capfd):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with Trials("run", str(script), [], options={"steps": 10, "timeout": 120}) as trials:
        a = trials.run(BASELINE)
        b = trials.run(Variation("again", "same run"), round=1)
        scaled = trials.run(Variation("scaled", "x2", env={"TRIAL_SCALE": "2"}))
        crashed = trials.run(Variation("crash", "raises", env={"TRIAL_CRASH": "1"}))
        dirs = list(trials._tmp)
    assert a.failure() is None and len(a.step_ms()) == 9  # 10 steps, the warm-up left out
    assert a.median_ms() > 0
    assert len(a.losses()) == 10 and all(isinstance(v, float) for v in a.losses())
    assert a.losses() == b.losses()  # seeded: the same run twice gives the same losses
    drift, n = loss_drift(a.losses(), scaled.losses())
    assert n == 10 and drift > 0.01
    peak, what = a.peak_memory()
    assert what == "host-rss" and peak > 10 * 2**20
    assert crashed.failure().startswith("RuntimeError: planted failure at ")
    assert not any(d.exists() for d in dirs)  # temp run dirs removed on close
    # the script's output is not echoed but kept (on these same runs)
    assert "training starts" not in capfd.readouterr().err
    assert any("training starts" in line for line in a.evidence.result.get("output_tail", []))


def test_budget_bounds_the_runs(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    trials = Trials("run", str(script), [], options={"steps": 3, "timeout": 120}, budget_s=0.0)
    assert trials.expired()
    trials.close()


def test_a_missing_script_is_refused_before_any_run(tmp_path: Path):
    from torchdoctor.errors import DoctorError

    with pytest.raises(DoctorError):
        Trials("run", str(tmp_path / "nope.py"), [], options={})


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
