"""Re-runs leave the user's files as the command's main run left them (issue 28, item 3).

``repro``, ``treat``, ``compile``'s eager run and the follow-ups run the script again under a
variation; before the fix the user's checkpoint, log and metrics after the command were the last
re-run's (a treated, eager or shorter training). Now each re-run is guarded
(``torchdoctor/runner/fileguard.py``): what it changes is put back when it ends.

The unit test drives the guard in a fresh interpreter (an audit hook cannot be removed); the end
to end tests run a script that leaves the trace of each run in its files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli

CHILD = r"""
import os, shutil, sys
from pathlib import Path
from torchdoctor.runner import fileguard

work, run = Path(sys.argv[1]), Path(sys.argv[2])
fileguard.install(run)
# what a training script does to its files when it runs again
(work / "ckpt.pt").write_bytes(b"rerun weights")                 # overwrite
with open(work / "train.log", "a") as f:                         # append
    f.write("rerun\n")
os.replace(work / "tmp.json", work / "metrics.json")             # atomic save over an old file
os.remove(work / "old.txt")                                      # remove
shutil.rmtree(work / "logs")                                     # wipe an output folder...
os.makedirs(work / "logs" / "new")                               # ...and make it again
(work / "logs" / "new" / "events").write_text("rerun events")
(work / "created.txt").write_text("only the re-run made this")   # a new file
with open(work / "link.txt", "w") as f:                          # a write through a link
    f.write("through the link")
os.rename(work / "a.bin", work / "b.bin")                        # a rename of the user's file
with open(run / "events.jsonl", "a") as f:                       # the run dir: not the user's
    f.write("{}\n")
fileguard.stop()
(work / "after_stop.txt").write_text("the harness's own, after the script")
"""


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = os.lstat(p)
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", p.read_bytes(), st.st_mode & 0o777, st.st_mtime_ns)
    return out


def test_a_guarded_run_leaves_every_file_as_it_found_it(tmp_path):
    work, run = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    run.mkdir()
    (work / "ckpt.pt").write_bytes(b"main run weights")
    (work / "ckpt.pt").chmod(0o640)
    (work / "train.log").write_text("main\n")
    (work / "tmp.json").write_text('{"loss": 0.5}')
    (work / "metrics.json").write_text('{"loss": 0.4}')
    (work / "old.txt").write_text("old")
    (work / "logs").mkdir()
    (work / "logs" / "events").write_text("main events")
    (work / "target.txt").write_text("the user's")
    (work / "link.txt").symlink_to(work / "target.txt")
    (work / "a.bin").write_bytes(b"\x00\x01")
    before = _tree(work)
    p = subprocess.run([sys.executable, "-c", CHILD, str(work), str(run)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert p.returncode == 0, p.stderr
    assert (work / "created.txt").exists() and (work / "ckpt.pt").read_bytes() == b"rerun weights"
    from torchdoctor.runner.fileguard import restore

    summary = restore(run)
    after = _tree(work)
    after.pop("after_stop.txt")  # written after stop(): not the script's
    assert after == before
    assert summary["not_restored"] == [] and summary["restored"] >= 7 and summary["removed"] >= 3, summary
    assert not (run / "guard").exists() and not (run / "guard.jsonl").exists()
    assert (run / "events.jsonl").read_text() == "{}\n"  # the run dir is left alone


RANK_CHILD = r"""
import os, sys, time
from pathlib import Path
from torchdoctor.runner import fileguard

work, top, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
run = top / f"rank{rank}"
run.mkdir(parents=True, exist_ok=True)
fileguard.install(run, also_skip=top)
(work / "ckpt.pt").write_bytes(f"rank {rank} weights".encode())   # both ranks: the later copy holds rank 0's
(work / f"shard{rank}.distcp").write_bytes(b"shard")                  # each its own new file
os.makedirs(work / "out", exist_ok=True)                              # a folder both make
(work / "out" / f"r{rank}.log").write_text("log")
(top / "rank0" / "collectives.jsonl").open("a").write("{}\n")        # torchdoctor's: not the user's
fileguard.stop()
"""


def test_a_ranked_re_run_is_put_back_from_the_copy_each_path_had_first(tmp_path):
    # ranked treat/repro re-runs (session 10): before, a rank's child did not guard its writes at
    # all, so a trial on N ranks left its checkpoints in the user's folder. Each rank now guards
    # its own in D/rank{R}; a file two ranks change is put back from the first copy (rank 1's
    # copy holds rank 0's write), what either created is removed
    work, top = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    (work / "ckpt.pt").write_bytes(b"main run weights")
    (work / "notes.txt").write_text("untouched")
    before = _tree(work)
    for rank in (0, 1):  # rank 1 changes the shared file after rank 0 did
        p = subprocess.run([sys.executable, "-c", RANK_CHILD, str(work), str(top), str(rank)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           timeout=60)
        assert p.returncode == 0, p.stderr
    assert (work / "ckpt.pt").read_bytes() == b"rank 1 weights"
    kept1 = [json.loads(x) for x in (top / "rank1" / "guard.jsonl").read_text().splitlines()]
    assert any(r["path"].endswith("ckpt.pt") and "kept" in r for r in kept1)  # rank 0's weights
    from torchdoctor.runner.fileguard import restore

    summary = restore(top)
    assert _tree(work) == before, summary
    assert summary["not_restored"] == []
    assert (top / "rank0" / "collectives.jsonl").read_text() == "{}\n{}\n"  # the run's own files stay
    assert not any((top / f"rank{r}" / "guard").exists() for r in (0, 1))


def test_a_file_over_the_bound_is_listed_not_copied(tmp_path, monkeypatch):
    work, run = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    run.mkdir()
    (work / "big.pt").write_bytes(b"x" * 100)
    code = ("import sys; from torchdoctor.runner import fileguard; fileguard.MAX_KEEP_BYTES = 10; "
            "fileguard.install(sys.argv[2]); open(sys.argv[1] + '/big.pt', 'wb').write(b'y')")
    p = subprocess.run([sys.executable, "-c", code, str(work), str(run)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert p.returncode == 0, p.stderr
    from torchdoctor.runner.fileguard import restore

    summary = restore(run)
    assert summary["not_restored"] == [{"path": str((work / "big.pt").resolve()),
                                        "why": "over the 0 GiB kept per re-run"}]


# -- end to end: the files after the command are the main run's ----------------------------------

TRACES = """\
import os
import sys

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
pid = os.getpid()
with open(os.path.join(out, "runs.log"), "a") as f:  # one line per run of this script
    f.write(f"{pid}\\n")
open(os.path.join(out, f"run-{pid}.marker"), "w").close()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
torch.save({"pid": pid, "model": model.state_dict()}, os.path.join(out, "ckpt.pt"))
with open(os.path.join(out, "last.txt"), "w") as f:
    f.write(str(pid))
"""


@pytest.mark.slow
def test_after_a_multi_run_command_the_files_are_the_main_runs(tmp_path):
    """repro (2 runs: the main one, then a guarded re-run). treat's runs are the same Trials'
    runs (TreatSession.run opens one Trials; every run after the main one is guarded, checked
    below without a process): its end-to-end check is test_interrupt_e2e's treat test, whose
    re-run's line in the user's file is taken out again (4 treat runs here cost 17 s of CPU)."""
    import torch

    argv = ["repro", "--steps", "10"]  # more than the script makes: it ends by itself, after its saves

    script, out = tmp_path / "train.py", tmp_path / "outputs"
    script.write_text(TRACES)
    p = run_cli(*argv, "--json", script, out, cwd=tmp_path, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    rep = json.loads(p.stdout)
    runs = (rep["metrics"].get("repro") or {}).get("runs") or rep["metrics"].get("trials")
    assert runs, rep["metrics"].keys()
    lines = (out / "runs.log").read_text().split()
    assert len(lines) == 1, lines  # the main run's line only: every re-run's append was undone
    main = lines[0]
    assert (out / "last.txt").read_text() == main
    assert torch.load(out / "ckpt.pt")["pid"] == int(main)
    assert sorted(os.listdir(out)) == sorted(["runs.log", f"run-{main}.marker", "ckpt.pt", "last.txt"])


@pytest.mark.parametrize("main_run, guarded", [(True, [False, True, True]), (False, [True, True])])
def test_every_run_but_the_main_one_is_guarded(monkeypatch, tmp_path, main_run, guarded):
    from torchdoctor.runner.launch import LaunchResult
    from torchdoctor.trials import Trials, Variation

    seen = []

    def fake(run_dir, probe, argv, *, options=None, **_kw):
        seen.append(bool((options or {}).get("guard_files")))
        return LaunchResult("exit", 0, 0.0)

    monkeypatch.setattr("torchdoctor.runner.launch.launch", fake)
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    with Trials("checkup", str(script), [], options={"steps": 2}, main_run=main_run) as trials:
        for i in range(len(guarded)):
            trials.run(Variation(f"v{i}", "a variation"))
    assert seen == guarded


def test_treat_guards_every_run_but_its_first_baseline(monkeypatch, tmp_path):
    """treat's whole schedule (baseline, then a trial alternating with baseline rounds) on a fake
    launcher: only its first run, the main one, writes the user's files for good."""
    from torchdoctor.runner.launch import LaunchResult
    from torchdoctor.runner.rundir import EVENTS
    from torchdoctor.treat.plan import Plan, Planned
    from torchdoctor.treat.session import TreatSession

    seen = []

    def fake(run_dir, probe, argv, *, options=None, **_kw):
        seen.append(bool((options or {}).get("guard_files")))
        steps = (json.dumps({"kind": "step", "step": i, "wall_s": 0.02, "data_s": 0.0}) for i in range(1, 7))
        Path(run_dir, EVENTS).write_text("\n".join(steps) + "\n")
        return LaunchResult("exit", 0, 0.0)

    monkeypatch.setattr("torchdoctor.runner.launch.launch", fake)
    monkeypatch.setattr(TreatSession, "_plan", lambda self, survey, codes, **kw: Plan(
        trials=[Planned("set-to-none", None, "--try")]))
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    TreatSession(str(script), [], {"steps": 6}, budget_s=None, forced=None, rounds=2,
                 progress=lambda m: None).run()
    assert seen == [False, True, True, True]  # baseline 1, set-to-none, baseline 2, set-to-none
