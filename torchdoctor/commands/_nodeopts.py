"""The multi-node options shared by the script probes and ``dist``: torchrun's own rendezvous
options, passed to torchrun on each node (see :mod:`torchdoctor.distributed.multinode`).

``node_params()`` gives the typer parameters; ``resolve_node(kw)`` pops them from a command's
keyword arguments and returns the NodeSpec (or None: one node), from the options or ``SLURM_*``.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Optional

import typer

KEYS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_timeout",
        "max_restarts")


def node_params() -> list[inspect.Parameter]:
    P = inspect.Parameter
    kw = P.KEYWORD_ONLY
    return [
        P("nnodes", kw, default=None, annotation=Annotated[Optional[int], typer.Option(
            "--nnodes", metavar="N", show_default=False,
            help="Nodes of the job (one torchdoctor per node, like torchrun; under srun: SLURM_NNODES).")]),
        P("node_rank", kw, default=None, annotation=Annotated[Optional[int], typer.Option(
            "--node-rank", metavar="K", show_default=False,
            help="This node's rank (0 prints the job report; under srun: SLURM_NODEID).")]),
        P("rdzv_endpoint", kw, default=None, annotation=Annotated[Optional[str], typer.Option(
            "--rdzv-endpoint", metavar="HOST:PORT", show_default=False,
            help="Rendezvous endpoint on node 0 (under srun: first host of SLURM_JOB_NODELIST, "
                 "MASTER_PORT or 29500); the job report uses PORT+1.")]),
        P("rdzv_backend", kw, default=None, annotation=Annotated[Optional[str], typer.Option(
            "--rdzv-backend", metavar="c10d|static", show_default=False,
            help="torchrun's rendezvous backend (default c10d).")]),
        P("rdzv_id", kw, default=None, annotation=Annotated[Optional[str], typer.Option(
            "--rdzv-id", metavar="ID", show_default=False,
            help="Job id shared by all nodes (under srun: SLURM_JOB_ID).")]),
        P("rdzv_timeout", kw, default=None, annotation=Annotated[Optional[float], typer.Option(
            "--rdzv-timeout", metavar="SECONDS", show_default=False,
            help="How long nodes wait for each other at the rendezvous (default 300).")]),
        P("max_restarts", kw, default=None, annotation=Annotated[Optional[int], typer.Option(
            "--max-restarts", metavar="0", show_default=False,
            help="Accepted for torchrun compatibility; only 0 (one attempt, one report).")]),
    ]


def resolve_node(kw: dict[str, Any]):
    from torchdoctor.distributed.multinode import resolve

    return resolve(**{k: kw.pop(k) for k in KEYS})
