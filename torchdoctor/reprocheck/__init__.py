"""``torchdoctor repro``: does the same script give the same run, and if not, why.

Parent side only (no torch): the runs are made by the trials layer (``torchdoctor/trials``) and
measured in the child by the instruments ``fingerprint`` (per step: batch, init, forward
outputs, gradients, update), ``rng_draws`` (global generators: draws, sites, state digests),
``fingerprint_ops`` (op by op, in the localising pair) and ``fingerprint_determinism`` (the
deterministic-mode pair). Here:

* :mod:`.steps`: two runs' fingerprints and losses → the first divergent step and what diverged
  first (pure);
* :mod:`.ops`: two op traces → the first op whose inputs or outputs differ (pure);
* :mod:`.rng`: two RNG traces → the generators that produced different values up to a step (pure);
* :mod:`.flow`: the orchestration (pair → localising pair → deterministic pair), the
  ``repro_compare`` evidence the rules (``rules/repro_runs.py``) judge, and the JSON section.

The resume check (``--resume-check``) lives in ``resume*.py`` modules of this package.
"""
