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
# switch dynamo off in the child, no edit of the script: torch.compile then returns the model
# itself (TORCHDYNAMO_DISABLE, read at each torch.compile call) and dynamo.config.disable is set
# at import (TORCH_COMPILE_DISABLE); checked on torch 2.13 (CPU) and 2.11 (GPU box)
EAGER_ENV = {"TORCHDYNAMO_DISABLE": "1", "TORCH_COMPILE_DISABLE": "1"}
