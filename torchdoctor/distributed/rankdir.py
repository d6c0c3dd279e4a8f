"""The per-rank run directory of a script probe under torchrun (names shared by both sides).

Layout under the run dir ``D`` of a ranked run (``--nproc-per-node N``)::

    D/meta.json              written by the parent (probe, argv, options with nproc_per_node)
    D/result.json            the parent's merged result (torchrun's exit, timeout, tail)
(one node of a multi-node job: ``rank{L}`` by local rank L, the global rank in its meta.json)

    D/rank{R}/meta.json      copy for rank R (options.out -> OUT/rank{R}, options.rank = R)
    D/rank{R}/pid            the rank's pid, written first (the parent signals and kills by it)
    D/rank{R}/events.jsonl   the rank's evidence (same contract as a single run)
    D/rank{R}/result.json    how the rank ended (child), completed by the parent
    D/rank{R}/stacks.txt     faulthandler dumps: SIGUSR1 (timeout), SIGTERM (stopped by
                             torchrun after another rank failed), fatal signals
    D/rank{R}/collectives.jsonl   one line per torch.distributed call (collective recorder)
    D/rank{R}/fr_trace.json  the flight recorder dump, written on the parent's request
    D/rank{R}/dump.request   created by the parent at the timeout; dump.done when served
    D/fr_pipe_{G}.pipe       NCCL ranks only: the Flight Recorder's dump pipe of global rank G
                             (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, unless the user set one)
    D/fr_dump_{G}            what NCCL's watchdog wrote when that pipe was poked

The child side (:func:`enter_rank_dir`) runs inside the harness before anything else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchdoctor.distributed.procs import die_with_parent

RANKED_ENV = "TORCHDOCTOR_RANKED"  # set by the parent for every rank launched through torchrun
NODE_ENV = "TORCHDOCTOR_NODE_RANK"  # and, in a multi-node job, the user's node rank
PID = "pid"
COLLECTIVES = "collectives.jsonl"
COLLECTIVES_OLD = "collectives.1.jsonl"  # the previous chunk after a rotation
FR_TRACE = "fr_trace.json"
FR_PIPE_STEM = "fr_pipe_"  # D/fr_pipe_{global rank}.pipe: made by each NCCL rank, poked at the timeout
FR_DUMP_STEM = "fr_dump_"  # D/fr_dump_{global rank}: NCCL's own dump (torch's pickle) when poked
DUMP_REQUEST = "dump.request"
DUMP_DONE = "dump.done"


def rank_dir(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}"


def is_ranked() -> bool:
    """True inside a rank process launched by a ranked run."""
    return bool(os.environ.get(RANKED_ENV)) and "RANK" in os.environ


def enter_rank_dir(run_dir: str | os.PathLike, meta: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Child side: make ``D/rank{RANK}``, write its meta and pid; return (rank dir, its meta)."""
    from torchdoctor.runner.rundir import META, write_json

    rank = int(os.environ["RANK"])
    # one node of a multi-node job: its dirs by local rank (the global ranks are torchrun's)
    node = os.environ.get(NODE_ENV)
    d = rank_dir(run_dir, int(os.environ.get("LOCAL_RANK", "0")) if node else rank)
    d.mkdir(parents=True, exist_ok=True)
    (d / PID).write_text(str(os.getpid()))
    options = dict(meta.get("options") or {})
    options["rank"] = rank
    options["world_size"] = int(os.environ.get("WORLD_SIZE", "0") or 0)
    if options.get("out"):  # artifacts of rank R go to OUT/rank{R}: ranks never overwrite each other
        options["out"] = str(Path(options["out"]) / f"rank{rank}")
    meta = {**meta, "options": options, "rank": rank}
    if node:
        meta.update(node_rank=int(node), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                    group_rank=int(os.environ.get("GROUP_RANK", "0") or 0))
    write_json(d / META, meta)
    die_with_parent()
    return d, meta
