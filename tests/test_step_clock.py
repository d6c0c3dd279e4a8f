"""The step clock with several optimizers (issue 13 item 10) and with threads (issue 14
item 10: see tests/test_threads.py for the runs).

A GAN's two optimizers counted as two steps: ``model.to(device)`` at the top of every
iteration showed in half the "steps" and was missed, and ``--steps N`` ran N/2 iterations.
A training step is now one iteration of the outer loop (one period of the cycle of optimizer
steps; runner/core.py, "Several optimizers").
"""

from __future__ import annotations

import pytest

from conftest import ROOT
from fixture_runs import run_fixture
from test_nan_fixtures import run_inprocess

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"


def _steps(ev) -> list[dict]:
    return ev.of("step")


def _iterations(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("iteration "))


def test_gan_step_is_one_iteration_and_steps_counts_iterations(capsys):
    ev = run_inprocess("checkup", SCRIPTS / "perf/gan_moved.py", (), {"steps": 12})
    assert ev.result["outcome"] == "stopped" and ev.result["steps"] == 12
    assert _iterations(capsys.readouterr().err) == 12  # --steps 12 = 12 whole iterations
    steps = _steps(ev)
    assert len(steps) == 12
    assert all(s["backwards"] == 2 for s in steps), [s["backwards"] for s in steps]


@pytest.mark.slow
def test_gan_moving_its_models_every_iteration_is_found():
    p = run_fixture("perf/gan_moved.py", "checkup --steps 20")  # the session's run
    rep = p.report
    codes = {f["code"] for f in rep["findings"]}
    assert "model-moved-in-loop" in codes, rep["findings"]
    f = next(f for f in rep["findings"] if f["code"] == "model-moved-in-loop")
    assert f["evidence"]["site"].endswith("gan_moved.py:26"), f["evidence"]
    assert rep["metrics"]["steps"]["count"] == 20
    assert _iterations(p.stderr) == 20


def test_critic_stepping_five_times_per_generator_step(capsys):
    ev = run_inprocess("checkup", SCRIPTS / "run/wgan_critic.py", ("5", "30"), {"steps": 10})
    assert ev.result["outcome"] == "stopped" and ev.result["steps"] == 10
    assert _iterations(capsys.readouterr().err) == 10
    assert [s["backwards"] for s in _steps(ev)] == [6] * 10


def test_an_optimizer_built_and_never_stepped_delays_but_does_not_stop_the_clock(capsys):
    """Three optimizers built, two step: the cycle is taken as known once the first optimizer
    came back LEARN_REPEATS times; the iterations run meanwhile are cut where they ended."""
    from torchdoctor.runner.core import LEARN_REPEATS

    script, args = SCRIPTS / "run/wgan_critic.py", ("1", "30", "--unused-optimizer")
    ev = run_inprocess("checkup", script, args, {"steps": 12})
    assert ev.result["outcome"] == "stopped" and ev.result["steps"] == 12
    assert _iterations(capsys.readouterr().err) == 12
    assert [s["backwards"] for s in _steps(ev)] == [2] * 12
    # a bound below the learning: the stop comes when the cycle is known
    ev = run_inprocess("checkup", script, args, {"steps": 3})
    assert ev.result["outcome"] == "stopped" and ev.result["steps"] == 3
    assert _iterations(capsys.readouterr().err) == LEARN_REPEATS + 1


def test_single_optimizer_steps_are_unchanged():
    ev = run_inprocess("checkup", SCRIPTS / "perf/healthy.py", (), {"steps": 7})  # one optimizer
    assert ev.result["steps"] == 7 and len(_steps(ev)) == 7
    assert all(s["backwards"] == 1 and s["source"] == "optimizer" for s in _steps(ev))


def test_first_optimizer_never_stepping_again_does_not_stop_the_clock(tmp_path, capsys):
    """A warm-up optimizer steps once, then a second one trains alone: the learning ends when
    the second came back LEARN_REPEATS times, and it closes the iterations."""
    from torchdoctor.runner.core import LEARN_REPEATS

    script = tmp_path / "two_phases.py"
    script.write_text(
        "import sys, torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(4, 1)\n"
        "warm = torch.optim.SGD(m.parameters(), lr=0.001)\n"
        "main = torch.optim.Adam(m.parameters(), lr=0.01)\n"
        "for it in range(40):\n"
        "    print(f'iteration {it + 1}', file=sys.stderr)\n"
        "    opt = warm if it == 0 else main\n"
        "    opt.zero_grad(); m(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()\n")
    ev = run_inprocess("checkup", script, (), {"steps": 20})
    assert ev.result["outcome"] == "stopped" and ev.result["steps"] == 20
    assert LEARN_REPEATS < 20
    assert _iterations(capsys.readouterr().err) == 21  # the warm-up step joins the first one
    assert sum(s["backwards"] for s in _steps(ev)) == 21
