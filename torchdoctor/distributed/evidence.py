"""What `torchdoctor dist` (no script) hands to its rules: two plain, JSON-safe evidence objects.

- :class:`LaunchEvidence` (probe ``dist-env``, rules in ``rules/dist_env.py`` and
  ``rules/dist_nccl_env.py``): the process environment, ``facts.gather_facts()``'s dict and
  ``topology.gather_topology()``'s dict;
- :class:`SelftestEvidence` (probe ``dist-selftest``, ``rules/dist_selftest.py``): the merged
  self-test result of ``selftest.run_selftest()`` and the link capacity of the GPUs it used.

The self-test's probe is not named ``dist``: that name is the script probe of
``torchdoctor dist SCRIPT``, whose rules read a ranked run's Evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class LaunchEvidence:
    env: Mapping[str, str]
    facts: Mapping[str, Any]
    topology: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SelftestEvidence:
    selftest: Mapping[str, Any]
    capacity: Mapping[str, Any] = field(default_factory=dict)
