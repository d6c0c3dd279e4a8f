"""Shared by the checkpoint rules: the evidence a rule reads, the judgment it writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchdoctor.checkpoint.compare import ModelSpec
from torchdoctor.checkpoint.roles import Roles
from torchdoctor.checkpoint.scan import ScanResult
from torchdoctor.checkpoint.values import Contents
from torchdoctor.findings import Finding

MAX_LIST = 12


@dataclass
class Evidence:
    contents: Contents
    roles: Roles
    scan: ScanResult | None = None
    scan_skip: str | None = None
    expect: str = "auto"  # auto | resume | weights
    model_spec: ModelSpec | None = None
    stub_root: Any = None  # the tree read without unpickling (devices, calls), even after --unsafe-load


@dataclass
class Judgment:
    findings: list[Finding] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mode: str = "weights"  # the expectation applied: resume | weights
    facts: dict = field(default_factory=dict)  # measured side facts for metrics


def mode_of(ev: Evidence) -> str:
    """resume | weights: what the checkpoint must hold (see rules.py and docs/checkpoint.md).

    Under ``auto`` a file that carries any training state (optimizer, scheduler, scaler, RNG)
    or a progress counter or a training config (nanoGPT's ``iter_num``/``config``, the DDP
    tutorial's ``EPOCHS_RUN``) is a training snapshot; only bare weights are an export.
    """
    if ev.expect in ("resume", "weights"):
        return ev.expect
    r = ev.roles
    return "resume" if (r.optimizers or r.schedulers or r.scalers or r.rng or r.progress or r.config) \
        else "weights"


def short(items: list, n: int = MAX_LIST) -> list:
    return list(items[:n]) + ([f"… (+{len(items) - n})"] if len(items) > n else [])
