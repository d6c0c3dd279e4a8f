"""Rule modules, one family per module, discovered by :func:`torchdoctor.judge.load_rules`.

Each module declares the finding codes it raises (:func:`torchdoctor.catalog.declare`, with their
thresholds as named constants) and registers its rules (:func:`torchdoctor.judge.rule`): pure
functions of one probe's evidence. The contract and the guarded judge are in ``judge.py``.
"""

from torchdoctor.judge import NotApplicable, judge, rule  # noqa: F401 - the rule modules' imports
