"""``RunOptions``: the options of one script run, one name each from the CLI to the child.

The command line builds it (``commands/_script.py``, ``dist``, ``demo``, ``repro``, ``treat``);
:func:`torchdoctor.pipeline.run.run_probe`, :func:`~torchdoctor.pipeline.run.run_ranked` and the
trials layer take it; :meth:`RunOptions.wire` is what ``runner.launch`` writes to ``meta.json``,
which the child reads as ``ctx.options`` under the same names::

    --steps N            steps            ctx.options["steps"]
    --timeout SECONDS    timeout          ctx.options["timeout"]
    --out DIR            out              ctx.options["out"]
    --nproc-per-node N   nproc_per_node   ctx.options["nproc_per_node"]
    --nnodes & co.       node             ctx.options["node"]   (NodeSpec.to_dict())
    -m MODULE            module           (how the target is run: not a child option)
    --window N (profile) probe["profile_active"]  ctx.options["profile_active"]

A probe's own options (``ExtraOption.key``) and a follow-up's or a trial's extra options live in
``probe``, by the key the child reads. The defaults live here, once: :data:`DEFAULT_STEPS`,
:data:`DEFAULT_TIMEOUT_S`; a command with another ``--steps`` default says so in ``steps_default``
(the report's "stopped at the --steps default" note compares with it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

DEFAULT_STEPS = 50
DEFAULT_TIMEOUT_S = 300.0

# the options that are not passed to the child: how the parent runs it
PARENT_ONLY = ("module", "quiet")


@dataclass(frozen=True)
class RunOptions:
    """The options of a script run (see the module's docstring for the names)."""

    steps: int = DEFAULT_STEPS  # stop cleanly after N optimizer steps; 0: no limit
    timeout: float | None = DEFAULT_TIMEOUT_S  # wall-clock bound in seconds; None: unbounded
    out: str | None = None  # --out DIR (the run dir is DIR/run), or None: a temporary dir
    module: bool = False  # the target is a module (python -m), not a script path
    quiet: bool = False  # no progress line (benches, nested runs)
    steps_default: int = DEFAULT_STEPS  # the command's own --steps default
    nproc_per_node: int | None = None  # torchrun on N local ranks; None: one process
    node: Mapping[str, Any] | None = None  # this node of a multi-node job (NodeSpec.to_dict())
    probe: Mapping[str, Any] = field(default_factory=dict)  # the probe's own options, by child key

    def __post_init__(self) -> None:
        object.__setattr__(self, "probe", MappingProxyType(dict(self.probe or {})))
        if self.node is not None and not isinstance(self.node, Mapping):  # a NodeSpec
            object.__setattr__(self, "node", self.node.to_dict())
        if self.node is not None:
            object.__setattr__(self, "node", MappingProxyType(dict(self.node)))

    @classmethod
    def of(cls, options: "RunOptions | Mapping[str, Any] | None") -> "RunOptions":
        """``options`` as RunOptions: a RunOptions as it is; a mapping (the Python callers'
        ``{"steps": 0, "timeout": 900, "quiet": True}``) by name, unknown keys to ``probe``."""
        if isinstance(options, RunOptions):
            return options
        return cls().with_options(options or {})

    def with_options(self, extra: Mapping[str, Any]) -> "RunOptions":
        """A copy with ``extra`` on top: a field's name sets the field, any other key goes to
        ``probe`` (a follow-up's ``{"nan_capture": ..., "steps": 3}``)."""
        names = {f.name for f in dataclasses.fields(self)} - {"probe"}
        fields = {k: v for k, v in extra.items() if k in names}
        probe = {**self.probe, **{k: v for k, v in extra.items() if k not in names}}
        return dataclasses.replace(self, **fields, probe=probe)

    def replace(self, **fields: Any) -> "RunOptions":
        return dataclasses.replace(self, **fields)

    def resolved(self) -> "RunOptions":
        """``out`` as an absolute path (the child runs in the user's folder, ranks in theirs)."""
        if not self.out:
            return self
        return dataclasses.replace(self, out=str(Path(self.out).resolve()))

    def node_spec(self):
        """This node's :class:`~torchdoctor.distributed.multinode.NodeSpec`, or None."""
        from torchdoctor.distributed.multinode import NodeSpec

        return NodeSpec.from_dict(self.node)

    def wire(self) -> dict[str, Any]:
        """The child's ``ctx.options`` (``meta.json``): every option under its own name, the
        parent-only ones (:data:`PARENT_ONLY`) left out, unset torchrun options left out."""
        out: dict[str, Any] = {"steps": self.steps, "timeout": self.timeout, "out": self.out,
                               "steps_default": self.steps_default}
        if self.nproc_per_node is not None:
            out["nproc_per_node"] = self.nproc_per_node
        if self.node is not None:
            out["node"] = dict(self.node)
        out.update(self.probe)
        return out

    def label(self, target: str) -> str:
        """The run's target as the report shows it (``-m pkg.mod`` or the script path)."""
        return " ".join(["-m", target] if self.module else [target])
