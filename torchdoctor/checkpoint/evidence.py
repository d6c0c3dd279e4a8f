"""The evidence the checkpoint rules judge: what was read, and the facts derived from it once.

``audit.py`` reads the checkpoint (``contents``), recognises the roles of its entries
(``roles``), scans the tensor data (``scan``), loads the ``--model`` spec, and then
:func:`torchdoctor.checkpoint.derive.derive` computes the facts that several rules or the report
need (what the file is for — ``mode`` —, whether it is one ``part`` of a larger checkpoint, the
classified pickle globals, the fit to ``--model``, the optimizer vs the parameters, the wrapper
prefixes, the split of non-finite tensors by role). The rules in ``torchdoctor/rules/checkpoint_*.py``
only read this object: no rule depends on another, and ``facts`` (reported under
``metrics.checkpoint.facts``) is filled here, not by the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdoctor.checkpoint.compare import ModelSpec, StateCompare
    from torchdoctor.checkpoint.pickle_globals import PickleGlobals
    from torchdoctor.checkpoint.roles import Roles
    from torchdoctor.checkpoint.scan import ScanResult
    from torchdoctor.checkpoint.values import Contents

MAX_LISTED = 12  # entries of one list in a finding's evidence or a fact (the rest is counted: "… (+n)")


@dataclass
class CheckpointEvidence:
    contents: Contents
    roles: Roles
    scan: ScanResult | None = None
    scan_skip: str | None = None
    expect: str = "auto"  # auto | resume | weights
    model_spec: ModelSpec | None = None
    stub_root: Any = None  # the tree read without unpickling (devices, calls), even after --unsafe-load
    # -- derived once (derive.py) ------------------------------------------------------------
    mode: str = "weights"  # the expectation applied: resume | weights | part
    part: dict | None = None  # {"part", "layout", "folder", "folder_audit", "siblings"}: one part of a whole
    globals: PickleGlobals | None = None  # the non-allowlisted pickle globals, sorted by what loading means
    model_fit: StateCompare | None = None  # checkpoint keys vs --model
    prefix_only_fit: str | None = None  # the key rewrite after which the keys fit --model exactly
    optimizer_fit: list = field(default_factory=list)  # [(OptimizerInfo, OptimizerCompare)]
    wrappers: list = field(default_factory=list)  # [(prefix, keys carrying it, wrapper)]
    nonfinite: list = field(default_factory=list)  # [(hit, role)]: weights/optimizer tensors with NaN/Inf
    neg_inf_masks: list = field(default_factory=list)  # −Inf-only tensors named *mask*: intentional
    nonfinite_bookkeeping: list = field(default_factory=list)  # NaN/Inf outside weights (best_score = inf)
    rng_missing: list = field(default_factory=list)  # generators absent from a present RNG state
    cuda_devices: list = field(default_factory=list)  # cuda devices tensors were saved on
    derive_failed: dict = field(default_factory=dict)  # {fact: "the … failed (see internal-error)"}
    facts: dict = field(default_factory=dict)  # measured side facts for metrics.checkpoint.facts

    @property
    def tree(self) -> Any:
        """The tree read without unpickling (devices and calls are only there after --unsafe-load)."""
        return self.stub_root if self.stub_root is not None else self.contents.root


def short(items: list, n: int = MAX_LISTED) -> list:
    return list(items[:n]) + ([f"… (+{len(items) - n})"] if len(items) > n else [])
