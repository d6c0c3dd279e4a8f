"""Triage: route a symptom, a pasted error or a whole log to the right skills, in order.

Deterministic and explainable: every route carries the words or log lines that put it there.

- ``symptoms``  the routing table as data: what users write, per skill (regexes + labels)
- ``order``     cross-cutting sequences and precedence rules ("OOM in distributed" -> dist first)
- ``playbooks`` per skill: the probe to run and the expert's steps, measure first
- (known PyTorch / CUDA / NCCL / DataLoader / compile / serialization texts: ``torchdoctor.errortext``,
  the table the crash and distributed rules read too)
- ``logscan``   finds the decisive line of a log (OOM, last exception, first NaN) and its numbers
- ``text``      normalisation and typo correction
- ``matcher``   puts them together: ``triage(text) -> Answer``
- ``render``    rich console output; ``cli_fast`` the fast entry point (no typer, no torch)

Nothing here imports torch, psutil, pynvml or typer.
"""

from __future__ import annotations


def triage(text: str, source: str = "args"):
    """Route ``text`` (a question, a pasted error, or a log when ``source`` is "stdin")."""
    from torchdoctor.triage.matcher import triage as _triage

    return _triage(text, source=source)
