"""Unit tests of the runner's rules and helpers on synthetic evidence (no child process)."""

from __future__ import annotations

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Report
from torchdoctor.evidence.steps import judged_steps, step_summary
from torchdoctor.judge import NotApplicable, judge
from torchdoctor.rules.crash import classify, crash, device_details, oom_details
from torchdoctor.rules.perf_step import cpu_oversubscribed, dataloader_bound, model_moved_in_loop
from torchdoctor.rules.repro import unseeded_run
from torchdoctor.rules.run import killed_by_signal, no_training_steps, script_hung
from torchdoctor.runner.stacks import main_thread, parse_stacks

import pytest


def steps(n, wall=0.010, data=0.0, t0=1.0, batches=1):
    return [{"kind": "step", "t": t0 + i * wall, "step": i + 1, "wall_s": wall, "data_s": data,
             "forward_s": 0.002, "backward_s": 0.003, "optimizer_s": 0.001,
             "other_s": max(0.0, wall - data - 0.006), "batches": batches, "backwards": 1,
             "source": "optimizer"} for i in range(n)]


LOADER = {"kind": "dataloader", "num_workers": 0, "pin_memory": False, "batch_size": 32,
          "dataset": "Jpegs", "getitem": "/x/data.py:10", "loop": "/x/train.py:40"}


def test_judged_steps_skip_warmup_only_when_enough():
    assert len(judged_steps(Evidence.from_events(steps(2)))) == 2
    assert [s["step"] for s in judged_steps(Evidence.from_events(steps(5)))] == [2, 3, 4, 5]


def test_step_summary_shares_sum_to_one():
    s = step_summary(Evidence.from_events(steps(6, wall=0.010, data=0.004)))
    assert s["count"] == 6 and s["judged"] == 5
    assert abs(sum(s["share"].values()) - 1.0) < 1e-3
    assert s["share"]["data"] == pytest.approx(0.4)


def test_dataloader_bound_threshold_and_evidence():
    ev = Evidence.from_events(steps(10, data=0.0035) + [LOADER])  # 35%
    [f] = dataloader_bound(ev)
    assert f.code == "dataloader-bound" and f.severity == "error"
    assert f.evidence["data_wait_share"] == pytest.approx(0.35)
    assert "num_workers=" in f.fix and "Jpegs.__getitem__" in f.evidence["slowest_stage"]
    assert dataloader_bound(Evidence.from_events(steps(10, data=0.0025) + [LOADER])) == []


def test_dataloader_bound_needs_batches_and_steps():
    with pytest.raises(NotApplicable):
        dataloader_bound(Evidence.from_events(steps(10, data=0.005, batches=0)))
    with pytest.raises(NotApplicable):
        dataloader_bound(Evidence.from_events(steps(2, data=0.005) + [LOADER]))


def test_dataloader_bound_not_raised_when_gpu_stays_busy():
    dev = [{"kind": "step_device", "step": i + 1, "busy": 0.95} for i in range(10)]
    assert dataloader_bound(Evidence.from_events(steps(10, data=0.005) + [LOADER] + dev)) == []
    dev = [{"kind": "step_device", "step": i + 1, "busy": 0.5} for i in range(10)]
    assert len(dataloader_bound(Evidence.from_events(steps(10, data=0.005) + [LOADER] + dev))) == 1


def moves(steps_, real=0, time_s=0.00001):
    return [{"kind": "module_moves", "step": s, "calls": 1, "real": real, "time_s": time_s,
             "site": "/x/train.py:50", "module": "Net"} for s in steps_]


def test_model_moved_in_loop_severity():
    base = steps(10)
    [f] = model_moved_in_loop(Evidence.from_events(base + moves(range(1, 11), real=1)))
    assert f.severity == "warning" and f.evidence["real_copies"] == 9
    [f] = model_moved_in_loop(Evidence.from_events(base + moves(range(1, 11))))
    assert f.severity == "info"
    # moved once before the loop (counted in step 1 = warm-up): healthy
    assert model_moved_in_loop(Evidence.from_events(
        base + moves([1], real=1) + [{"kind": "module_moves_summary"}])) == []


def test_cpu_oversubscribed_structural_and_load():
    cpu = {"kind": "cpu", "torch_threads": 8, "local_processes": 1, "cores": 2, "affinity": 2}
    [f] = cpu_oversubscribed(Evidence.from_events(steps(10) + [cpu]))
    assert "8 intra-op threads" in f.title
    ok = {**cpu, "torch_threads": 1, "window_steps": [2, 10], "window_s": 0.09,
          "threads_on_cpu_s": 0.085, "threads_runqueue_wait_s": 0.005, "other_load_cores": 1.5,
          "logical_cpus": 2}
    assert cpu_oversubscribed(Evidence.from_events(steps(10) + [ok])) == []
    starved = {**ok, "threads_runqueue_wait_s": 0.09}
    [f] = cpu_oversubscribed(Evidence.from_events(steps(10) + [starved]))
    assert "host is loaded" in f.title and "waited for a CPU 51%" in f.title
    quiet = {**starved, "other_load_cores": 0.2}
    assert cpu_oversubscribed(Evidence.from_events(steps(10) + [quiet])) == []
    sleeper = {**starved, "threads_on_cpu_s": 0.01, "threads_runqueue_wait_s": 0.01}  # mostly asleep
    assert cpu_oversubscribed(Evidence.from_events(steps(10) + [sleeper])) == []


def test_unseeded_run():
    [f] = unseeded_run(Evidence.from_events(steps(3) + [{"kind": "seeding", "calls": 0}]))
    assert f.severity == "info"
    assert unseeded_run(Evidence.from_events(steps(3) + [{"kind": "seeding", "calls": 2}])) == []
    with pytest.raises(NotApplicable):
        unseeded_run(Evidence.from_events(steps(3)))


@pytest.mark.parametrize("msg,typ,code", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
     "of which 1.50 GiB is free.", "OutOfMemoryError", "out-of-memory"),
    ("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes",
     "RuntimeError", "out-of-memory"),
    ("one of the variables needed for gradient computation has been modified by an inplace "
     "operation: [torch.FloatTensor [8, 4]], which is output 0 of Sigmoid, is at version 1; "
     "expected version 0 instead.", "RuntimeError", "inplace-modified"),
    ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
     "cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)",
     "RuntimeError", "device-mismatch"),
    ("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same",
     "RuntimeError", "device-mismatch"),
    ("mat1 and mat2 shapes cannot be multiplied (8x4 and 5x1)", "RuntimeError", "script-crashed"),
])
def test_crash_classification(msg, typ, code):
    assert classify({"type": typ, "message": msg}) == code


def test_oom_and_device_details():
    d = oom_details("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                    "of 79.19 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this "
                    "process has 77.60 GiB memory in use.")
    assert d["requested_bytes"] == 2 * 2**30 and d["gpu"] == 0
    assert d["process_in_use_bytes"] == round(77.6 * 2**30)  # the one byte parser (errortext.numbers) rounds
    d = device_details("Expected all tensors to be on the same device, but found at least two "
                       "devices, cuda:0 and cpu! (when checking argument for argument mat1 in "
                       "method wrapper_CUDA_addmm)")
    assert d == {"devices": ["cuda:0", "cpu"], "argument": "mat1", "op": "wrapper_CUDA_addmm"}


def crash_result(msg, typ="RuntimeError", steps_=4):
    return {"outcome": "crash", "exit_code": 1, "steps": steps_, "exception": {
        "type": typ, "message": msg,
        "traceback": [["/x/train.py", 30, "<module>", True],
                      ["/venv/site-packages/torch/autograd/__init__.py", 200, "backward", False]],
        "user_frame": {"file": "/x/train.py", "line": 30, "function": "<module>",
                       "code": "loss.backward()"}}}


def test_crash_rule_merges_crash_context_and_routes():
    ev = Evidence.from_events(
        [{"kind": "crash_context", "source": "memory", "evidence": {"peak_bytes": 123},
          "fixes": ["Specific fix first"]}],
        result=crash_result("CUDA out of memory. Tried to allocate 1.00 GiB", "OutOfMemoryError"))
    [f] = crash(ev)
    assert f.code == "out-of-memory" and f.evidence["peak_bytes"] == 123
    assert f.evidence["phase"] == "backward" and f.evidence["step"].startswith("5 ")
    assert f.fix.startswith("Specific fix first")
    [f] = crash(Evidence.from_events([], result=crash_result(
        "Error(s) in loading state_dict for Net: Missing key(s)")))
    assert f.code == "script-crashed" and f.skill == "checkpointing-and-reproducibility"


def test_crash_rule_exit_codes():
    assert crash(Evidence.from_events([], result={"outcome": "exit", "exit_code": 0})) == []
    assert crash(Evidence.from_events([], result={"outcome": "stopped", "exit_code": 0})) == []
    [f] = crash(Evidence.from_events([], result={"outcome": "exit", "exit_code": 2}))
    assert "code 2" in f.title


def test_hung_vs_slow():
    res = {"outcome": "timeout", "timeout_s": 10}
    start = [{"kind": "script_start", "t": 0.5}]
    # steps until t=2, nothing after: hung
    [f] = script_hung(Evidence.from_events(start + steps(10, wall=0.1, t0=1.0), result=res))
    assert f.code == "script-hung" and f.evidence["steps_done"] == 10
    # stepping until it was killed: not a silent "no problems" (issue 14 item 14)
    [f] = script_hung(Evidence.from_events(start + steps(95, wall=0.1, t0=0.6), result=res))
    assert f.title.startswith("still running at the 10 s timeout and made no step")
    [f] = script_hung(Evidence.from_events(start + steps(95, wall=0.1, t0=0.6), result={
        **res, "clean_stop_requested": True, "clean_stop_grace_s": 2.0}))
    assert "did not stop at a step boundary within 2 s" in f.title
    # never stepped: hung
    assert len(script_hung(Evidence.from_events(start, result=res))) == 1
    assert script_hung(Evidence.from_events(start, result={"outcome": "exit"})) == []


def test_signal_and_no_steps():
    [f] = killed_by_signal(Evidence.from_events([], result={"outcome": "signal",
                                                            "signal": "SIGKILL"}))
    assert "out-of-memory killer" in f.title
    assert killed_by_signal(Evidence.from_events([], result={"outcome": "exit"})) == []
    [f] = no_training_steps(Evidence.from_events([], result={"outcome": "exit", "exit_code": 0}))
    assert f.severity == "warning"
    assert no_training_steps(Evidence.from_events(steps(1), result={"outcome": "exit"})) == []
    assert no_training_steps(Evidence.from_events([], result={"outcome": "crash"})) == []


def test_threads_that_trained_and_ended_before_one_was_followed_are_info():
    # tests/fixtures/scripts/run/threads.py on a loaded box: 3 threads x 10 steps ended while the
    # main thread was still in Thread.start(); 30 boundaries seen, none followed: a warning before
    res = {"outcome": "exit", "exit_code": 0, "steps": 0, "other_thread_boundaries": 30}
    [f] = no_training_steps(Evidence.from_events([], result=res))
    assert f.severity == "info" and f.evidence["other_thread_boundaries"] == 30
    assert "30 optimizer step(s) or backward(s) ran in other threads" in f.title


STACKS = """Thread 0x00007f00000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/x/train.py", line 21 in <module>
  File "/td/torchdoctor/runner/harness.py", line 120 in _run_target
  File "/td/torchdoctor/runner/harness.py", line 150 in main
  File "<string>", line 1 in <module>
Current thread 0x00007f00000002 (most recent call first):
  File "/usr/lib/python3.11/queue.py", line 180 in get
"""


def test_parse_stacks_finds_main_thread_and_keeps_last_dump():
    s = parse_stacks(STACKS + STACKS.replace("line 21", "line 22"))
    assert len(s["threads"]) == 2
    main = main_thread(s["threads"])
    assert ["/x/train.py", 22, "<module>"] in main["frames"]


def test_run_rules_on_probe_run_give_one_finding_per_outcome():
    r = Report("checkup")
    judge("run", Evidence.from_events(steps(3), result={"outcome": "stopped"}), r)
    assert r.findings == []
