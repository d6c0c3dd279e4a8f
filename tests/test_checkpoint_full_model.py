"""A whole pickled nn.Module (``torch.save(model, f)``, pytorch/examples word_language_model) is one
cause: ``ckpt-full-model-pickle``, once. Its own classes (the user's model class and torch.nn
classes) are that finding's evidence; ``ckpt-unsafe-pickle`` is raised only for globals beyond them,
and a code-running global stays an error whatever else is in the file (issue 13).
"""

import os

import torch
import torch.nn as nn

from torchdoctor.pipeline.checkpoint import Options, run
from torchdoctor.report.console import render_to_text


class RNNLM(nn.Module):
    """word_language_model style: encoder, LSTM, decoder, dropout."""

    def __init__(self, ntoken=50, ninp=8, nhid=8):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid


class Vocab:
    """A user object saved beside the model (not a module)."""

    def __init__(self):
        self.idx2word = ["<eos>", "the"]


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def _codes(rep):
    return {f.code: f.severity for f in rep.findings}


def test_whole_module_pickle_is_one_warning(tmp_path):
    torch.manual_seed(0)
    with open(tmp_path / "model.pt", "wb") as f:
        torch.save(RNNLM(), f)
    rep = run(str(tmp_path / "model.pt"), Options())
    assert _codes(rep) == {"ckpt-full-model-pickle": "warning", "ckpt-missing-optimizer": "info"}, \
        [(f.code, f.severity, f.title) for f in rep.findings]
    f = next(f for f in rep.findings if f.code == "ckpt-full-model-pickle")
    assert "weights_only=True" in f.title and "2.6" in f.title and "state_dict()" in f.fix
    classes = f.evidence["classes_outside_allowlist"]
    assert f"{__name__}.RNNLM" in classes and "torch.nn.modules.rnn.LSTM" in classes
    assert rep.metrics["checkpoint"]["weights_only_load"] == "refused"
    render_to_text(rep)


def test_legacy_format_whole_module_is_one_warning(tmp_path):
    torch.save(RNNLM(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    rep = run(str(tmp_path / "legacy.pt"), Options())
    assert _codes(rep) == {"ckpt-full-model-pickle": "warning", "ckpt-missing-optimizer": "info"}, \
        [(f.code, f.severity, f.title) for f in rep.findings]


def test_other_classes_beside_the_module_are_still_unsafe(tmp_path):
    torch.save({"model": RNNLM(), "vocab": Vocab()}, tmp_path / "both.pt")
    rep = run(str(tmp_path / "both.pt"), Options())
    codes = _codes(rep)
    assert codes["ckpt-full-model-pickle"] == "warning" and codes["ckpt-unsafe-pickle"] == "warning"
    f = next(f for f in rep.findings if f.code == "ckpt-unsafe-pickle")
    assert f.evidence["globals"] == [f"{__name__}.Vocab"], f.evidence
    assert "RNNLM" not in f.title and f.evidence["module_classes"] == "reported by ckpt-full-model-pickle"


def test_code_running_global_inside_a_module_is_an_error(tmp_path):
    m = RNNLM()
    m.hook = Payload()  # a plain attribute: pickled with the module
    torch.save(m, tmp_path / "evil.pt")
    rep = run(str(tmp_path / "evil.pt"), Options())
    f = next(f for f in rep.findings if f.code == "ckpt-unsafe-pickle")
    assert f.severity == "error" and any("system" in g for g in f.evidence["code_running_globals"])
    assert rep.exit_code("error") == 1
