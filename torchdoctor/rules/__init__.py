"""Rule modules, one family per module, discovered by :func:`torchdoctor.catalog.load_rules`.

Each module declares the finding codes it raises (:func:`torchdoctor.catalog.declare`, with their
thresholds as named constants) and registers its rules (:func:`torchdoctor.judge.rule`): pure
functions of one probe's evidence. The contract and the guarded judge are in ``judge.py``.

This package imports nothing: the catalogue discovers its modules by name, and each of them
imports the catalogue and the judge (below it), never the other way round.
"""
