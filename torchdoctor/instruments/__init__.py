"""Instruments: measurement installed inside the child process around the user's script.

The contract an instrument class follows (what it declares, implements, and how it fails) is
stated once, in :mod:`torchdoctor.instruments.base`; :mod:`torchdoctor.instruments.testing`
ships the recording context that tests drive instruments with. The instruments themselves
live in one sub-package per family (``docs/architecture.md``, "The instruments"):

* ``profile/``: the profiler window and its analysis (plain data, no torch);
* ``perf/``: step-time contributors: CPU contention, module moves, the loader that fed the
  steps, the FLOP count of one step;
* ``memory/``: the per-step sampler, the memory probe's costlier detail, grad-in-eval;
* ``nan/``: the non-finite monitor and the re-run that names the op;
* ``training/``: gradient bookkeeping, loop settings, custom autograd Functions;
* ``crash/``: what a crash needs explained (device placement, the anomaly-mode re-run);
* ``repro/``: step and op fingerprints, RNG draws and seeding, deterministic mode;
* ``save_audit/``: the script's own ``torch.save`` calls against the live objects;
* ``dist/``: ranked runs: collectives, samplers, step arrivals;
* ``dynamo/``: ``torch.compile``'s counters and diagnostics;
* ``trials/``: the child side of compared runs: treatments, the trial trace.

Shared helpers sit at the top (``_sites.py``: where the user built an object). Discovery is
automatic and walks the sub-packages: a new instrument is a new module with a registered class.
"""

from __future__ import annotations

from typing import Iterable

from torchdoctor.discovery import import_submodules
from torchdoctor.instruments import base


def all_instruments() -> dict[str, type[base.Instrument]]:
    """Every registered instrument class by name (imports every module of every sub-package)."""
    import_submodules(__name__, __path__, recursive=True)
    return base.registered()


def instruments_producing(needs: Iterable[str]) -> list[type[base.Instrument]]:
    """Instrument classes that produce one of the evidence kinds ``needs``, in dispatch order."""
    wanted = frozenset(needs)
    found = [c for c in all_instruments().values() if c.produces & wanted]
    return sorted(found, key=lambda c: (c.priority, c.name))
