"""Registries of the script probes: what each probe needs armed, metrics providers, discovery.

**What a probe arms** is derived: :func:`probe_needs` is the union of the ``needs`` of the
probe's rules (:func:`torchdoctor.judge.needs_of`) and of the few needs that no rule of it has
(:data:`EXTRA_NEEDS`: follow-up re-runs, the bench's sampler-only probe);
:func:`instruments_for` arms the instruments that produce one of them. The parent computes a
run's needs (:func:`armed_needs`) and passes them to the child harness in ``meta.json``, so the
code that runs in the user's process loads no rule.

**Metrics providers.** A family contributes report metrics with a function in its own module
under ``torchdoctor/pipeline/`` (discovered automatically)::

    from torchdoctor.pipeline.registry import metrics_provider

    @metrics_provider("memory", needs={"mem", "mem_info"})
    def memory_metrics(ev: Evidence) -> dict | None:
        ...  # None when the run has no memory evidence

``run_probe`` stores each non-None result as ``report.metrics[name]``, for every probe.
Providers are pure (Evidence in, JSON-able dict out) and must not raise; one that does becomes
an ``internal-error`` finding. A provider's ``needs`` are the kinds it reads; they arm nothing
(it summarises whatever the probe's rules had armed, e.g. the memory timeline of ``checkup``),
and ``tests/test_codes.py`` checks that something produces each of them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

# Needs that no rule of the probe has, in one place: the probe named is the one whose
# instruments the run is armed with.
EXTRA_NEEDS: dict[str, frozenset[str]] = {
    # inplace-modified's re-run under anomaly mode (pipeline/followups_nan.py anomaly_rerun):
    # the crash rule that raises it judges every script run, so every run arms it
    "run": frozenset({"anomaly_trace"}),
    # nonfinite-*'s op-by-op re-run of one step, and checkup's NaN replay, which re-runs
    # under "nan" (pipeline/followups_nan.py)
    "nan": frozenset({"nan_capture"}),
    # bench/memory_overhead.py: the harness and the per-step memory sampler alone, no rule
    "memory-sampler": frozenset({"mem"}),
    # the yardstick: FLOPs of one step for metrics.flops (pipeline/flops_metrics.py); no rule
    # judges it yet, the report shows achieved FLOP/s and MFU
    "profile": frozenset({"flops"}),
}

# The judged probes whose needs an armed probe serves (default: itself). "run" is armed for
# every script run, so it also arms what the cross-rank rules ("ranks") read: any run may be
# one rank of a torchrun run (those instruments stay inert unless it is). "ranks" judges the
# ranks' merged evidence and arms nothing itself.
SERVES: dict[str, tuple[str, ...]] = {"run": ("run", "ranks"), "ranks": ()}


def probe_needs(probe: str) -> frozenset[str]:
    """Every evidence kind a run under ``probe`` needs measured."""
    from torchdoctor.judge import needs_of

    out = set(EXTRA_NEEDS.get(probe, ()))
    for p in SERVES.get(probe, (probe,)):
        out |= needs_of(p)
    return frozenset(out)


def armed_needs(probe: str) -> frozenset[str]:
    """What a script run under ``probe`` arms instruments for: the probe's needs and those of
    ``"run"`` (every script run). Computed in the parent and passed to the child harness
    (``launch(needs=...)``, ``meta.json``), so the child does not load the rules."""
    return probe_needs(probe) | probe_needs("run")


def instruments_for(probe: str) -> list[Any]:
    """Instrument classes armed by ``probe`` itself, in dispatch order: those that produce an
    evidence kind it needs (a script run arms ``probe``'s and ``"run"``'s)."""
    from torchdoctor.instruments import instruments_producing

    return instruments_producing(probe_needs(probe))


_PROVIDERS: dict[str, Callable[[Any], dict | None]] = {}
_PROVIDER_NEEDS: dict[str, frozenset[str]] = {}


def metrics_provider(name: str, *, needs: Iterable[str]):
    def deco(fn):
        if name in _PROVIDERS and _PROVIDERS[name] is not fn:
            raise ValueError(f"metrics provider registered twice: {name}")
        _PROVIDERS[name] = fn
        _PROVIDER_NEEDS[name] = frozenset(needs)
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


def provider_needs() -> dict[str, frozenset[str]]:
    """{provider name: the evidence kinds it reads}."""
    load_probe_modules()
    return dict(_PROVIDER_NEEDS)
