"""Multi-node launch options: one torchdoctor agent per node, each starting torchrun with the
rendezvous options the user would give torchrun (never imports torch).

``--nnodes N --node-rank K --rdzv-endpoint HOST:PORT [--rdzv-backend c10d] [--rdzv-id ID]
[--rdzv-timeout S] [--max-restarts 0]`` on every node, or nothing at all under ``srun`` (the
values come from ``SLURM_*``, :mod:`torchdoctor.distributed.slurm`). :func:`resolve` checks
them (bad usage: exit 2 before anything starts) and returns the :class:`NodeSpec` that
:class:`~torchdoctor.distributed.torchrun.RankSet` turns into torchrun arguments.

The node rank here is the user's (``--node-rank``, ``SLURM_NODEID``): node 0 prints the job
report. torchrun's c10d rendezvous numbers the nodes (and so the global ranks) in its own
order, so the ranks of node K are read from the ranks themselves, never computed.

The job report is gathered through a TCP store that node 0's agent hosts at the rendezvous
host, port + 1 (``TORCHDOCTOR_GATHER_PORT`` overrides it): see
:mod:`torchdoctor.distributed.gather`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from torchdoctor.distributed.rankdir import NODE_ENV  # noqa: F401 - set for every rank of a job
from torchdoctor.errors import DoctorError

BACKENDS = ("c10d", "static")
DEFAULT_BACKEND = "c10d"
DEFAULT_RDZV_ID = "torchdoctor"
DEFAULT_RDZV_TIMEOUT_S = 300.0  # torchrun's own join timeout is 600 s
GATHER_PORT_ENV = "TORCHDOCTOR_GATHER_PORT"


@dataclass(frozen=True)
class NodeSpec:
    nnodes: int
    node_rank: int
    rdzv_endpoint: str
    rdzv_backend: str = DEFAULT_BACKEND
    rdzv_id: str = DEFAULT_RDZV_ID
    rdzv_timeout: float = DEFAULT_RDZV_TIMEOUT_S
    source: str = "options"  # or "slurm"

    @property
    def host(self) -> str:
        return split_endpoint(self.rdzv_endpoint)[0]

    @property
    def port(self) -> int:
        return split_endpoint(self.rdzv_endpoint)[1]

    def gather_port(self, env: Mapping[str, str] | None = None) -> int:
        env = os.environ if env is None else env
        v = env.get(GATHER_PORT_ENV)
        if v and _digits(v) and 0 < int(v) < 65536:
            return int(v)
        return self.port + 1

    def torchrun_args(self) -> list[str]:
        """What replaces ``--standalone`` on torchrun's command line. ``--node-rank`` only for
        the static backend: c10d numbers the nodes itself (torchrun warns that it ignores it)."""
        args = [f"--nnodes={self.nnodes}",
                *([f"--node-rank={self.node_rank}"] if self.rdzv_backend == "static" else []),
                f"--rdzv-backend={self.rdzv_backend}", f"--rdzv-endpoint={self.rdzv_endpoint}",
                f"--rdzv-id={self.rdzv_id}"]
        if self.rdzv_backend == "c10d":
            args.append(f"--rdzv-conf=join_timeout={self.rdzv_timeout:g}")
        else:  # static: the store's wait for every node, whole seconds
            args.append(f"--rdzv-conf=timeout={max(1, int(round(self.rdzv_timeout)))}")
        return args

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "NodeSpec | None":
        if not d:
            return None
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _digits(s: str) -> bool:
    """ASCII digits only: ``str.isdigit`` is also true of ``"²"``, which ``int()`` refuses."""
    return s.isascii() and s.isdigit() and len(s) < 7


def split_endpoint(ep: str) -> tuple[str, int]:
    ep = ep.strip()
    if ep.startswith("["):  # [::1]:29500
        host, _, rest = ep[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = ep.rpartition(":")
    if not host or not _digits(port) or not 0 < int(port) < 65535:
        raise DoctorError(f"--rdzv-endpoint must be HOST:PORT, not {ep!r}",
                          hint="e.g. --rdzv-endpoint node01:29500 (the host of node 0)")
    return host, int(port)


def resolve(nnodes: int | None, node_rank: int | None, rdzv_endpoint: str | None,
            rdzv_backend: str | None, rdzv_id: str | None, rdzv_timeout: float | None,
            max_restarts: int | None, env: Mapping[str, str] | None = None) -> NodeSpec | None:
    """The multi-node spec from the options, else from Slurm; None for a one-node run.

    Raises DoctorError (exit 2) on options that cannot form a job.
    """
    from torchdoctor.distributed.slurm import NodeListError, slurm_nodes

    env = os.environ if env is None else env
    if max_restarts not in (None, 0):
        raise DoctorError(f"--max-restarts must be 0, not {max_restarts}",
                          hint="torchdoctor reports on one attempt of the job; restarts would "
                               "replace the evidence of the attempt that failed")
    if rdzv_timeout is not None and not rdzv_timeout > 0:
        raise DoctorError(f"--rdzv-timeout must be > 0 seconds, not {rdzv_timeout:g}")
    source = "options"
    if nnodes is None:
        try:
            sl = slurm_nodes(env)
        except NodeListError as e:
            raise DoctorError(f"cannot read SLURM_JOB_NODELIST: {e}") from None
        if sl is None:
            if any(v is not None for v in (node_rank, rdzv_endpoint, rdzv_id)):
                raise DoctorError("--node-rank, --rdzv-endpoint and --rdzv-id need --nnodes")
            return None
        if int(sl["tasks"]) != int(sl["nnodes"]):
            raise DoctorError(f"srun started {sl['tasks']} tasks on {sl['nnodes']} nodes; "
                              "torchdoctor needs one task per node",
                              hint="srun --ntasks-per-node=1 torchdoctor ... --nproc-per-node N")
        nnodes = int(sl["nnodes"])
        node_rank = int(sl["node_rank"]) if node_rank is None else node_rank
        rdzv_endpoint = rdzv_endpoint or str(sl["rdzv_endpoint"])
        rdzv_id = rdzv_id or str(sl["rdzv_id"])
        source = "slurm"
    if nnodes < 1:
        raise DoctorError(f"--nnodes must be at least 1, not {nnodes}")
    if nnodes == 1 and rdzv_endpoint is None:
        return None
    if node_rank is None:
        raise DoctorError("--nnodes needs --node-rank (0 on the node that prints the job report)")
    if not 0 <= node_rank < nnodes:
        raise DoctorError(f"--node-rank must be in 0..{nnodes - 1}, not {node_rank}")
    if not rdzv_endpoint:
        raise DoctorError("--nnodes needs --rdzv-endpoint HOST:PORT (the host of node 0)")
    split_endpoint(rdzv_endpoint)
    backend = (rdzv_backend or DEFAULT_BACKEND).strip().lower()
    if backend not in BACKENDS:
        raise DoctorError(f"--rdzv-backend must be one of {', '.join(BACKENDS)}, not {rdzv_backend!r}")
    rid = rdzv_id or DEFAULT_RDZV_ID
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in rid):
        raise DoctorError(f"--rdzv-id may hold letters, digits, '-', '_' and '.', not {rid!r}")
    return NodeSpec(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint.strip(),
                    rdzv_backend=backend, rdzv_id=rid,
                    rdzv_timeout=float(rdzv_timeout or DEFAULT_RDZV_TIMEOUT_S), source=source)
