"""Registries of the script probes: metrics providers (and discovery of probe modules).

A family contributes report metrics with a function in its own module under
``torchdoctor/pipeline/`` (discovered automatically)::

    from torchdoctor.pipeline.registry import metrics_provider

    @metrics_provider("memory")
    def memory_metrics(ev: Evidence) -> dict | None:
        ...  # None when the run has no memory evidence

``run_probe`` stores each non-None result as ``report.metrics[name]``. Providers are pure
(Evidence in, JSON-able dict out) and must not raise; one that does becomes an
``internal-error`` finding.
"""

from __future__ import annotations

from typing import Any, Callable

_PROVIDERS: dict[str, Callable[[Any], dict | None]] = {}


def metrics_provider(name: str):
    def deco(fn):
        if name in _PROVIDERS and _PROVIDERS[name] is not fn:
            raise ValueError(f"metrics provider registered twice: {name}")
        _PROVIDERS[name] = fn
        return fn

    return deco


def load_probe_modules() -> None:
    """Import every module of ``torchdoctor.pipeline`` once (providers and follow-ups register)."""
    import torchdoctor.pipeline as pkg
    from torchdoctor.discovery import import_submodules

    import_submodules(pkg.__name__, pkg.__path__)


def metrics_providers() -> dict[str, Callable[[Any], dict | None]]:
    load_probe_modules()
    return dict(_PROVIDERS)
