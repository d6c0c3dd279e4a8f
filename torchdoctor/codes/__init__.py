"""The finding-code catalog: each code declared exactly once.

A family module in this package (``env.py``, ``run.py``, ``perf.py`` ...) calls
:func:`declare` at import time for each code it owns. :func:`catalog` imports every
family module once and returns the codes by name. Declaring a code twice is an
error caught at import (and by ``tests/test_codes.py``).
"""

from __future__ import annotations

from torchdoctor.catalog import SEVERITIES, CodeInfo, declare, lookup  # noqa: F401
from torchdoctor.discovery import import_submodules


def catalog():
    """All declared codes (the family modules here and the rule modules)."""
    from torchdoctor import catalog as _catalog

    import_submodules(__name__, __path__)
    return _catalog.catalog()
