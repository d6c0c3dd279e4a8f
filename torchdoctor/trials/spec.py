"""A variation of a run: what a trial changes, declared as data.

A variation never edits the user's files: it is applied in the child process by an instrument
that reads ``ctx.options`` (e.g. ``{"treatment": {"name": "tf32"}}``), or by environment
variables set for the child (``PYTORCH_CUDA_ALLOC_CONF``, ``TORCHDYNAMO_DISABLE``), and it may
arm more instruments through ``needs`` (evidence kinds, see ``pipeline/registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variation:
    name: str  # "baseline", a treatment name, "run-b", "eager", …
    setting: str = ""  # what is changed, for people: "num_workers=2, persistent_workers=True"
    options: dict[str, Any] = field(default_factory=dict)  # child options (ctx.options)
    env: dict[str, str] = field(default_factory=dict)  # environment variables for the child
    needs: frozenset[str] = frozenset()  # evidence kinds to arm beyond the probe's own

    def describe(self) -> str:
        return f"{self.name} ({self.setting})" if self.setting else self.name


BASELINE = Variation("baseline", "the script as it is")
