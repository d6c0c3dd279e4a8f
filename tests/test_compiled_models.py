"""Instruments on a torch.compile'd model: never traced into the graph, never an internal error.

Regression (H200, GPU-truth harness, torch 2.11; reproduced on CPU with torch 2.13): under
``nan`` a compiled model raised ``internal-error`` "nan_monitor failed in _fwd_post": the hook's
owner-thread check came before its is-compiling check, dynamo broke the graph on it and then
compiled the monitor's own ``_record`` as a frame, which read ``nbytes`` of a tensor with
symbolic sizes. The is-compiling check comes first now, as in the step clock's hooks.
"""

from __future__ import annotations

import json
import textwrap

SCRIPT = textwrap.dedent('''
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model.compile(backend="eager", dynamic=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(6):
        x = torch.randn(8 + i, 16)  # a new batch size each step: symbolic shapes
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
''')


def test_nan_on_a_compiled_model_raises_no_internal_error(cli, tmp_path):
    script = tmp_path / "compiled_train.py"
    script.write_text(SCRIPT)
    p = cli("nan", "--json", "--steps", "5", script, timeout=300)
    rep = json.loads(p.stdout)
    assert not [f for f in rep["findings"] if f["code"] == "internal-error"], rep["findings"]
    assert rep["metrics"]["run"]["steps"] == 5
