"""A script that crashes in torch.load(weights_only=True) gets the weights_only fix (issue 13, item 12).

The message is torch's own, produced here by the installed torch: its ANSI bold codes must not reach
the title, and the fix must say how to allowlist (or when weights_only=False is acceptable), not
"compare keys and shapes".
"""

import numpy as np
import torch

from torchdoctor.evidence import Evidence
from torchdoctor.report.console import render_to_text
from torchdoctor.rules.crash import crash


def _refusal(tmp_path) -> str:
    torch.save({"model": {"w": torch.ones(2)}, "rng": np.random.get_state()}, tmp_path / "ckpt.pt")
    try:
        torch.load(tmp_path / "ckpt.pt")
    except Exception as e:  # noqa: BLE001 - torch's UnpicklingError is what we want
        return str(e)
    raise AssertionError("torch.load accepted a numpy RNG state with weights_only=True")


def _result(msg):
    return {"outcome": "crash", "exit_code": 1, "steps": 0, "exception": {
        "type": "UnpicklingError", "message": msg,
        "traceback": [["/x/train.py", 12, "<module>", True]],
        "user_frame": {"file": "/x/train.py", "line": 12, "function": "<module>",
                       "code": "ckpt = torch.load(args.resume)"}}}


def test_weights_only_refusal_gets_the_allowlist_fix(tmp_path):
    msg = _refusal(tmp_path)
    assert "\x1b[" in msg  # torch's text really carries ANSI codes (the premise of the test)
    [f] = crash(Evidence.from_events([], result=_result(msg)))
    assert f.code == "script-crashed" and f.skill == "checkpointing-and-reproducibility"
    assert "\x1b" not in f.title and "\x1b" not in f.evidence["exception"]
    assert "Weights only load failed" in f.title
    assert "add_safe_globals([numpy._core.multiarray._reconstruct])" in f.fix
    assert "safe_globals" in f.fix and "weights_only=False" in f.fix and "UInt32DType" in f.fix
    assert "compare keys and shapes" not in f.fix
    from torchdoctor.findings import Report

    rep = Report("checkup", target="train.py")
    rep.add(f)
    text = render_to_text(rep)
    assert "\x1b" not in text and "[1m" not in text


def test_state_dict_mismatch_keeps_its_own_fix():
    [f] = crash(Evidence.from_events([], result=_result(
        "Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: \"fc.weight\"")))
    assert "compare keys and shapes" in f.fix and "add_safe_globals" not in f.fix
