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


def run_instrument(body) -> dict | None:
    ctx = RecordingContext()
    inst = ChildProcesses()
    original = mpp.BaseProcess.start
    inst.install(ctx)
    try:
        body()
    finally:
        inst.uninstall(ctx)
    assert mpp.BaseProcess.start is original  # the patch is undone
    ev = ctx.of("processes_started")
    return ev[-1] if ev else None


def test_a_started_process_is_named_by_its_target_and_line():
    def body():
        q = FORK.Queue()
        p = FORK.Process(target=work, args=(q,))
        p.start()
        assert q.get(timeout=30) == 1
        p.join(timeout=30)
        assert p.exitcode == 0

    [g] = run_instrument(body)["groups"]
    assert g["target"].endswith("test_child_processes.work")
    assert g["where"].endswith(f"test_child_processes.py:{work.__code__.co_firstlineno}")
    assert (g["kind"], g["method"], g["count"], len(g["pids"])) == ("script", "fork", 1, 1)


def test_dataloader_workers_are_counted_as_such_not_as_the_scripts_code():
    def body():
        dl = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1,
                        multiprocessing_context=FORK)
        assert sum(len(b[0]) for b in dl) == 8

    [g] = run_instrument(body)["groups"]
    assert g["kind"] == "DataLoader worker" and g["count"] == 1


def test_no_process_started_writes_no_event():
    assert run_instrument(lambda: None) is None


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
    assert d["target"].endswith("test_child_processes.work") and d["kind"] == "script"
    assert d["via"] == "torch.multiprocessing.spawn"


EXIT = {"outcome": "exit", "exit_code": 0}


def started(*groups):
    return [{"kind": "processes_started", "groups": list(groups), "other_starts": 0}]


TRAIN = {"target": "__main__.train", "where": "/x/train.py:12", "kind": "script", "method": "spawn",
         "count": 2, "pids": [11, 12]}


def test_steps_in_processes_the_script_started_are_info_and_say_where():
    [f] = no_training_steps(Evidence.from_events(started(TRAIN), result=EXIT))
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
              "kind": "DataLoader worker"}
    [f] = no_training_steps(Evidence.from_events(started(loader), result=EXIT))
    assert f.severity == "warning" and "processes_started" not in f.evidence
