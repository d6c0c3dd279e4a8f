"""Registries of the script probes: metrics providers (and discovery of probe modules).

A family contributes report metrics with a function in its own module under
``torchdoctor/probes/`` (discovered automatically)::

    from torchdoctor.probes.registry import metrics_provider

    @metrics_provider("memory")
    def memory_metrics(ev: Evidence) -> dict | None:
        ...  # None when the run has no memory evidence

``run_probe`` stores each non-None result as ``report.metrics[name]``. Providers are pure
(Evidence in, JSON-able dict out) and must not raise; one that does becomes an
``internal-error`` finding.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

_PROVIDERS: dict[str, Callable[[Any], dict | None]] = {}
_loaded = False


def metrics_provider(name: str):
    def deco(fn):
        if name in _PROVIDERS and _PROVIDERS[name] is not fn:
            raise ValueError(f"metrics provider registered twice: {name}")
        _PROVIDERS[name] = fn
        return fn

    return deco


def load_probe_modules() -> None:
    """Import every module of ``torchdoctor.probes`` once (providers and follow-ups register)."""
    global _loaded
    if _loaded:
        return
    import torchdoctor.probes as pkg

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        importlib.import_module(f"{pkg.__name__}.{mod}")
    _loaded = True


def metrics_providers() -> dict[str, Callable[[Any], dict | None]]:
    load_probe_modules()
    return dict(_PROVIDERS)
