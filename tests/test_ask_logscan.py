"""The decisive line of a log: OOM first, then the last error (wrappers defer), then the first NaN."""

from __future__ import annotations

import random
import time
from pathlib import Path

from torchdoctor.triage.logscan import scan
from torchdoctor.triage.matcher import triage

FIX = Path(__file__).parent / "fixtures" / "ask"


def make_training_log(n: int = 10_000, nan_at: int | None = None, oom: bool = False, seed: int = 0) -> str:
    """A plain training log of ``n`` lines: step lines, a repeated DataLoader warning, optionally NaN
    from step ``nan_at`` on, optionally ending in a CUDA OOM traceback."""
    r = random.Random(seed)
    out, loss = [], 4.0
    tail = [
        "Traceback (most recent call last):",
        '  File "/home/user/train.py", line 120, in <module>',
        "    loss.backward()",
        '  File "/usr/lib/python3/site-packages/torch/_tensor.py", line 648, in backward',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
        "23.64 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 22.60 GiB memory in "
        "use. Of the allocated memory 21.30 GiB is allocated by PyTorch, and 912.00 MiB is reserved by PyTorch "
        "but unallocated.",
    ] if oom else []
    for i in range(n - len(tail)):
        if i % 997 == 5:
            out.append("/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:626: UserWarning: This "
                       "DataLoader will create 8 worker processes in total. Our suggested max number of worker "
                       "in current system is 4, which is smaller than what this DataLoader is going to create.")
            continue
        step = i + 1
        if nan_at and step >= nan_at:
            out.append(f"[10:{i // 600:02d}:{i % 60:02d}] epoch {step // 1000} step {step} loss nan lr 3.00e-04 "
                       "grad_norm nan 12.1 it/s")
        else:
            loss = max(0.05, loss * 0.9997 + r.uniform(-0.02, 0.02))
            out.append(f"[10:{i // 600:02d}:{i % 60:02d}] epoch {step // 1000} step {step} loss {loss:.4f} "
                       f"lr 3.00e-04 grad_norm {r.uniform(0.5, 2):.3f} 12.1 it/s")
    return "\n".join(out + tail) + "\n"


def test_first_nan_in_a_10k_line_log_with_step_and_last_finite_loss():
    log = make_training_log(nan_at=8123)
    t0 = time.perf_counter()
    a = triage(log, source="stdin")
    dt = time.perf_counter() - t0
    assert a.lines == 10_000 and a.mode == "log"
    assert a.decisive.kind == "nan" and a.decisive.line == 8123 and "step 8123 loss nan" in a.decisive.text
    assert a.numbers["step"] == 8123 and a.numbers["last_finite_line"] == 8122
    assert [r.skill for r in a.routes] == ["debugging-techniques"]
    assert dt < 1.0


def test_oom_at_the_end_of_a_10k_line_log():
    a = triage(make_training_log(oom=True), source="stdin")
    assert a.decisive.id == "cuda-oom" and a.decisive.line == 10_000
    assert a.numbers["requested_bytes"] == round(1.5 * 2**30) and a.numbers["free_bytes"] == round(1.02 * 2**30)
    assert a.decisive.where == "/home/user/train.py:120 in <module>"
    assert a.routes[0].skill == "tensor-operations-and-memory"
    assert any(x.get("id") == "dl-too-many-workers" and x["count"] == 11 for x in a.also)


def test_oom_beats_a_later_wrapper_and_rank_markers_put_distributed_first():
    a = triage((FIX / "torchrun_oom.log").read_text(), source="stdin")
    assert a.decisive.id == "cuda-oom" and a.decisive.line == 16
    assert a.numbers["gpu"] == 1 and a.numbers["requested_bytes"] == 4 * 2**30
    assert any("fragmentation" in n for n in a.notes)  # 4.12 GiB unallocated >= 4.00 GiB requested
    assert [r.skill for r in a.routes] == ["distributed-training-strategies", "tensor-operations-and-memory"]
    assert a.decisive.where == "/home/user/project/model.py:42 in forward"


def test_nccl_watchdog_abort_without_python_exception():
    a = triage((FIX / "nccl_watchdog.log").read_text(), source="stdin")
    assert a.decisive.id == "nccl-watchdog-timeout" and a.decisive.line == 10
    assert a.numbers["op"] == "ALLREDUCE" and a.numbers["timeout_ms"] == 600000
    assert a.routes[0].skill == "distributed-training-strategies"


def test_nan_in_an_amp_log_routes_debugging_then_mixed_precision():
    a = triage((FIX / "nan_amp.log").read_text(), source="stdin")
    assert a.decisive.kind == "nan" and a.numbers["step"] == 353
    assert a.numbers["last_finite_loss"] > 1000  # the blow-up before the NaN is quoted
    assert [r.skill for r in a.routes] == ["debugging-techniques", "mixed-precision-and-optimization"]


def test_dataloader_worker_traceback_points_at_the_dataset_line():
    """A real traceback (make_real_errors.py): the original error inside the worker is decisive."""
    a = triage((FIX / "tb_dataloader_worker.txt").read_text(), source="stdin")
    assert a.decisive.text == "ValueError: corrupt sample 2"
    assert a.decisive.id == "dl-worker-caught" and "Caught ValueError" in a.decisive.via
    assert a.decisive.where.endswith("in __getitem__")


def test_real_inplace_and_state_dict_tracebacks():
    a = triage((FIX / "tb_inplace.txt").read_text(), source="stdin")
    assert a.decisive.id == "inplace-modified" and a.numbers["tensor"] == "torch.FloatTensor [4]"
    assert [r.skill for r in a.routes][:2] == ["debugging-techniques", "custom-autograd-functions"]
    a = triage((FIX / "tb_state_dict.txt").read_text(), source="stdin")
    assert a.decisive.id == "state-dict-keys" and a.numbers["key_prefixes"] == ["module."]
    assert a.routes[0].skill == "checkpointing-and-reproducibility"


def test_unknown_last_exception_is_decisive_and_routes_debugging():
    log = ("step 1 loss 2.0\nstep 2 loss 1.9\nTraceback (most recent call last):\n"
           '  File "/home/u/train.py", line 9, in <module>\n    y = batch["label"]\nKeyError: \'label\'\n')
    a = triage(log, source="stdin")
    assert a.decisive.kind == "exception" and a.decisive.text == "KeyError: 'label'"
    assert a.decisive.where == "/home/u/train.py:9 in <module>"
    assert a.routes[0].skill == "debugging-techniques"


def test_last_exception_wins_over_an_earlier_known_error():
    log = ("RuntimeError: CUDA error: device-side assert triggered\nretrying\nstep 1 loss 1.0\nstep 2 loss 0.9\n"
           "ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 64])\n")
    assert scan(log).decisive.entry.id == "bn-single"


def test_only_warnings_the_last_warning_is_decisive():
    log = "\n".join(["step 1 loss 1.0", "step 2 loss 0.9",
                     "UserWarning: Detected call of `lr_scheduler.step()` before `optimizer.step()`. ",
                     "step 3 loss 0.8"])
    d = scan(log).decisive
    assert d.kind == "warning" and d.entry.id == "scheduler-order"


def test_healthy_log_has_no_decisive_line_and_asks():
    log = "\n".join(f"step {i} loss {1 / i:.3f} lr 1e-3 info: ok" for i in range(1, 50))
    a = triage(log, source="stdin")
    assert a.decisive is None and a.routes == [] and a.clarify


def test_nan_inside_words_or_error_messages_is_not_a_nan_line():
    log = "\n".join(["step 1 loss 0.5 nanoseconds=12 info=3", "inference done", "step 2 loss 0.4",
                     "setting nan_to_num", "step 3 loss 0.3"])
    assert scan(log).first_nan is None
