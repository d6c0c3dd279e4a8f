"""``torchdoctor treat``: each performance and memory fix applied to the unmodified script, measured.

Two halves, apart as everywhere in torchdoctor:

* **child side** (imported by the ``treatment`` instrument inside the user's process, may import
  torch): one small module per family applies a treatment in-process and notes the user's
  file:line it changed — :mod:`.data` (``dataloader-workers``, ``pin-memory``),
  :mod:`.precision` (``tf32``, ``bf16-autocast``), :mod:`.model` (``channels-last``,
  ``compile``), :mod:`.optim` (``fused-optimizer``, ``set-to-none``), :mod:`.backend`
  (``cudnn-benchmark``, ``expandable-segments``), :mod:`.dist` (on N ranks: ``ddp-bucket-cap``,
  ``fsdp-bf16``, ``compile-blocks``); :mod:`.survey` records what the script built (loaders,
  optimizers, models, flags; on a rank, :mod:`.dist_survey`: DDP and ``fully_shard`` calls) so
  that the parent can choose the trials; :mod:`.child` holds the applier base class.
* **parent side** (never imports torch): :mod:`.catalogue` declares every treatment once (what it
  changes, when it applies, its loss tolerance and why); :mod:`.plan` chooses the trials from
  the baseline's findings, its survey and the device; :mod:`.verdict` judges a trial on numbers
  (pure, unit-tested); :mod:`.fixes` says what to write where; :mod:`.measure` is the one place a
  trial's metrics are assembled; :mod:`.session` runs the schedule (baseline and treated rounds
  alternating, the combined trial, the budget, Ctrl-C); under ``--nproc-per-node N``
  :mod:`.ranked_session` runs it with every run on N ranks and :mod:`.ranked_plan` chooses.

The runs themselves go through the trials layer (:mod:`torchdoctor.trials`).
"""
