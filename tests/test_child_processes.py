"""Processes the script starts itself (instruments/training/child_processes.py) and what
no-training-steps says about them (rules/run.py).

pytorch/examples' mnist_hogwild trains in two processes it starts (`mp.Process`, spawn): the
launched process never steps, and the report warned "point torchdoctor at the script that
trains". The instrument names the started processes' targets; the rule then says where the
training went (info). Fork-started processes here: no interpreter start, fast.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process as mpp
import pickle

import torch
from torch.utils.data import DataLoader, TensorDataset

from torchdoctor.evidence import Evidence
from torchdoctor.instruments.testing import RecordingContext
from torchdoctor.instruments.training.child_processes import ChildProcesses, describe_target
from torchdoctor.rules.run import no_training_steps

FORK = multiprocessing.get_context("fork")


def work(q):  # a process target of "the script's own code" (a file that is not a library)
    q.put(1)


def run_instrument(body) -> list[dict]:
    ctx = RecordingContext()
    inst = ChildProcesses()
    original = mpp.BaseProcess.start
    inst.install(ctx)
    try:
        body()
    finally:
        inst.uninstall(ctx)
    assert mpp.BaseProcess.start is original  # the patch is undone
    return ctx.of("process_started")


def test_a_started_process_is_named_by_its_target_and_line():
    def body():
        q = FORK.Queue()
        p = FORK.Process(target=work, args=(q,))
        p.start()
        assert q.get(timeout=30) == 1
        p.join(timeout=30)
        assert p.exitcode == 0

    [g] = run_instrument(body)
    assert g["target"].endswith("test_child_processes.work")
    assert g["where"].endswith(f"test_child_processes.py:{work.__code__.co_firstlineno}")
    assert (g["role"], g["method"]) == ("script", "fork") and g["pid"] > 0


def test_dataloader_workers_are_counted_as_such_not_as_the_scripts_code():
    def body():
        dl = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1,
                        multiprocessing_context=FORK)
        assert sum(len(b[0]) for b in dl) == 8

    [g] = run_instrument(body)
    assert g["role"] == "DataLoader worker"


def test_no_process_started_writes_no_event():
    assert run_instrument(lambda: None) == []


def test_a_process_object_pickles_the_same_under_the_instrument():
    # spawn pickles the Process (its target and args): nothing of ours may ride along
    p = FORK.Process(target=work, args=(1,))
    before = pickle.dumps((p._target, p._args))
    run_instrument(lambda: None)
    assert pickle.dumps((p._target, p._args)) == before
    assert "start" not in vars(p)


def test_torch_spawn_is_read_through_to_the_function_it_runs():
    from torch.multiprocessing.spawn import _wrap

    d = describe_target(_wrap, (work, 0, (), None))
    assert d["target"].endswith("test_child_processes.work") and d["role"] == "script"
    assert d["via"] == "torch.multiprocessing.spawn"


EXIT = {"outcome": "exit", "exit_code": 0}


def started(*starts):
    return [{"kind": "process_started", "pid": 10 + i, **s} for i, s in enumerate(starts)]


TRAIN = {"target": "__main__.train", "where": "/x/train.py:12", "role": "script", "method": "spawn"}


def test_steps_in_processes_the_script_started_are_info_and_say_where():
    [f] = no_training_steps(Evidence.from_events(started(TRAIN, TRAIN), result=EXIT))
    assert f.severity == "info"
    assert "`train` in 2 process(es) it started itself" in f.title
    assert f.evidence["processes_started"] == [
        "__main__.train at /x/train.py:12: 2 process(es), start method spawn"]
    assert "call `train(...)` directly" in f.fix


def test_mp_spawn_points_to_torchrun():
    g = {**TRAIN, "target": "main.main_worker", "via": "torch.multiprocessing.spawn"}
    [f] = no_training_steps(Evidence.from_events(started(g), result=EXIT))
    assert f.severity == "info" and "--nproc-per-node" in f.fix


def test_only_library_processes_leave_the_warning():
    loader = {**TRAIN, "target": "torch.utils.data._utils.worker._worker_loop",
              "role": "DataLoader worker"}
    [f] = no_training_steps(Evidence.from_events(started(loader), result=EXIT))
    assert f.severity == "warning" and "processes_started" not in f.evidence


SPAWN_JOIN = """Thread 0x00007f00000001 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 415 in select
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 947 in wait
  File "/venv/site-packages/torch/multiprocessing/spawn.py", line 140 in join
  File "/venv/site-packages/torch/multiprocessing/spawn.py", line 340 in spawn
  File "/x/main.py", line 131 in main
  File "/x/main.py", line 530 in <module>
"""


def timed_out(tmp_path, stacks, *events):
    from torchdoctor.rules.run import script_hung
    from torchdoctor.runner.rundir import STACKS

    (tmp_path / STACKS).write_text(stacks)
    ev = Evidence(meta={}, events=[{"kind": "script_start", "t": 0.5}, *events],
                  result={"outcome": "timeout", "timeout_s": 60}, run_dir=tmp_path)
    return script_hung(ev), no_training_steps(ev)


def test_a_timeout_while_waiting_for_its_own_processes_is_not_a_hang(tmp_path):
    # pytorch/examples imagenet --multiprocessing-distributed on CPU: the rank trained in the
    # spawned process until the 60 s timeout; reported as script-hung "waits for a DataLoader
    # worker" before
    g = {**TRAIN, "target": "__mp_main__.main_worker", "via": "torch.multiprocessing.spawn"}
    hung, [f] = timed_out(tmp_path, SPAWN_JOIN, *started(g))
    assert hung == []
    assert f.severity == "info" and f.evidence["timeout_s"] == 60
    assert "stopped at the 60 s timeout while it waited for them" in f.title


def test_the_same_timeout_without_processes_of_its_own_is_still_a_hang(tmp_path):
    hung, none = timed_out(tmp_path, SPAWN_JOIN)
    assert [h.code for h in hung] == ["script-hung"] and none == []
