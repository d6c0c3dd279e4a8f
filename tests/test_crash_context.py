"""Crash contexts are measured in the child at every crash; the parent keeps the ones about the
kind of crash it classified (instruments only measure, issue 15)."""

from __future__ import annotations

from torchdoctor.evidence import Evidence
from torchdoctor.rules.crash import crash


def _result(msg, typ="RuntimeError"):
    return {"outcome": "crash", "exit_code": 1, "steps": 2,
            "exception": {"type": typ, "message": msg, "traceback": [
                ["/x/train.py", 30, "<module>", True]],
                "user_frame": {"file": "/x/train.py", "line": 30, "function": "<module>"}}}


DEVICE_CTX = {"kind": "crash_context", "source": "crashctx", "for_code": "device-mismatch",
              "evidence": {"unregistered_tensors": ["self.scale: cpu (plain attribute)"]},
              "fixes": ["Register the tensor attributes named above"]}
ANY_CTX = {"kind": "crash_context", "source": "anomaly", "evidence": {"forward_op": "exp"},
           "fixes": ["Out-of-place"]}


def test_context_for_another_kind_of_crash_is_left_out():
    [f] = crash(Evidence.from_events([DEVICE_CTX, ANY_CTX], result=_result("bad label 7", "ValueError")))
    assert f.code == "script-crashed"
    assert "unregistered_tensors" not in f.evidence and "Register" not in f.fix
    assert f.evidence["forward_op"] == "exp" and f.fix.startswith("Out-of-place")  # no for_code: any


def test_context_for_the_classified_crash_is_merged():
    msg = "Expected all tensors to be on the same device, but found at least two devices, meta and cpu!"
    [f] = crash(Evidence.from_events([DEVICE_CTX], result=_result(msg)))
    assert f.code == "device-mismatch"
    assert f.evidence["unregistered_tensors"] and f.fix.startswith("Register the tensor attributes")


def test_oom_fixes_are_ranked_in_the_parent():
    GiB = 1 << 30
    ctx = {"kind": "crash_context", "source": "memory", "for_code": "out-of-memory",
           "oom": {"evidence": {"device": "cuda:0", "free_bytes": 2 * GiB, "capacity_bytes": 80 * GiB},
                   "live": {"parts": {"activations": 40 * GiB, "cached_free": 5 * GiB},
                            "activations_fp32": 40 * GiB, "n_blocks": 0}}}
    msg = "CUDA out of memory. Tried to allocate 8.00 GiB."
    [f] = crash(Evidence.from_events([ctx], result=_result(msg, "OutOfMemoryError")))
    assert f.code == "out-of-memory" and f.evidence["requested_bytes"] == 8 * GiB
    assert list(f.evidence)[-3:] == ["breakdown", "breakdown_bytes", "estimated_savings"]
    assert f.evidence["estimated_savings"] == {"bf16-autocast": "20 GiB", "smaller-micro-batch": "20 GiB",
                                               "expandable-segments": "5 GiB"}
    assert f.fix.startswith("Run forward under torch.autocast")
    [g] = crash(Evidence.from_events([ctx], result=_result("bad label", "ValueError")))
    assert "breakdown" not in g.evidence
