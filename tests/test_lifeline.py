"""runner/lifeline.py: a child keeps its own deadline (no parent needed) and leaves its stacks."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import ROOT


def test_the_child_stops_itself_past_its_deadline_and_dumps_its_stacks(tmp_path):
    stacks = tmp_path / "stacks.txt"
    code = ("import sys, time; sys.path.insert(0, sys.argv[1])\n"
            "from torchdoctor.runner import lifeline\n"
            "f = open(sys.argv[2], 'w')\n"
            "lifeline.watch(time.time() + 0.5, f)\n"
            "def stuck_here():\n"
            "    time.sleep(60)\n"
            "stuck_here()\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, str(ROOT), str(stacks)], capture_output=True,
                       text=True, timeout=30, start_new_session=True)  # as the runner starts it
    assert time.monotonic() - t0 < 10
    assert p.returncode == -9  # it killed itself (after its session and descendants)
    assert "past its --timeout" in p.stderr
    assert "stuck_here" in stacks.read_text()


def test_deadline_comes_from_meta():
    from torchdoctor.runner.lifeline import DEADLINE_MARGIN_S, deadline_of

    assert deadline_of({"started": 100.0, "options": {"timeout": 60}}) == 160.0 + DEADLINE_MARGIN_S
    assert deadline_of({"started": 100.0, "options": {}}) is None


def test_a_child_that_does_not_lead_its_session_never_kills_the_callers_session(tmp_path):
    victim = ("import sys, time; sys.path.insert(0, sys.argv[1])\n"
              "from torchdoctor.runner import lifeline\n"
              "lifeline.watch(time.time() + 0.3)\n"
              "time.sleep(60)\n")
    wrapper = ("import subprocess, sys\n"
               "sib = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
               "v = subprocess.run([sys.executable, '-c', sys.argv[2], sys.argv[1]])\n"
               "print(v.returncode, sib.poll() is None)\n"
               "sib.kill()\n")
    p = subprocess.run([sys.executable, "-c", wrapper, str(ROOT), victim], capture_output=True,
                       text=True, timeout=30, start_new_session=True)
    assert p.stdout.split() == ["-9", "True"], p.stdout + p.stderr
