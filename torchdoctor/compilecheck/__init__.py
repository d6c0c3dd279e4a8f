"""``torchdoctor compile``: what torch.compile did with the script, read from dynamo itself.

Shared by the ``compile`` command and the ``compile`` treatment of ``treat`` (one diagnostics
instrument, one reading of its evidence):

* measure (child): the ``dynamo_diag`` instrument (graph breaks, recompiles, the recompile
  limit, compile records and the steps that compiled) and ``dynamo_counters`` (dynamo's
  counters at the end: also armed by ``checkup``). A trial arms them by adding
  :data:`DIAG_NEEDS` to its ``Variation.needs``; the events are the same as under ``compile``;
* read (parent, no torch): :mod:`.text` (dynamo's messages into fields, used in the child),
  :mod:`.summary` (the evidence into sites, functions, step times: what the rules and the
  JSON ``compile`` section read).
"""

from __future__ import annotations

# the evidence kinds of the diagnostics: add them to a Variation's needs to get them in a trial
DIAG_NEEDS = frozenset({"dynamo_break", "dynamo_recompile", "dynamo_limit", "dynamo_compile",
                        "dynamo_step", "dynamo_counters"})
# switch dynamo off in the child, no edit of the script: dynamo's own setting ``config.disable``,
# read from TORCH_COMPILE_DISABLE at its import (every torch 2.x) and checked at each frame:
# torch.compile still returns its wrapper (a script that reads ``model._orig_mod`` runs as it
# is) and the wrapper runs the function eager. (TORCHDYNAMO_DISABLE=1 instead makes
# torch.compile return the bare model, which such a script cannot run.) Checked on 2.13; the
# eager run's own counters confirm that nothing was compiled (compare.py).
EAGER_ENV = {"TORCH_COMPILE_DISABLE": "1"}
