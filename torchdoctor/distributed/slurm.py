"""Multi-node launch options from Slurm's variables (pure: reads a mapping, never the network).

Under ``srun torchdoctor checkup --nproc-per-node 8 train.py`` (one task per node) every node
gets ``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST``; the
rendezvous endpoint is the first host of the node list (Slurm's compressed form, e.g.
``gpu[01-04,07],login1``, expanded by :func:`expand_nodelist`) on ``MASTER_PORT`` or
torchrun's default port 29500.
"""

from __future__ import annotations

from typing import Mapping

DEFAULT_PORT = 29500  # torchrun's own default rendezvous port


class NodeListError(ValueError):
    """A node list that is not in Slurm's hostlist syntax."""


def _split_top(s: str) -> list[str]:
    """Split on the commas outside brackets."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise NodeListError(f"unbalanced ']' in {s!r}")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise NodeListError(f"unbalanced '[' in {s!r}")
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()  # not "²": str.isdigit() is true of it, int() refuses it


def _range(spec: str) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7'] (zero padding kept, as Slurm does)."""
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (_digits(lo) and _digits(hi)) or int(hi) < int(lo):
                raise NodeListError(f"bad range {part!r}")
            if int(hi) - int(lo) > 100_000:
                raise NodeListError(f"range too large: {part!r}")
            width = len(lo) if lo.startswith("0") else 0
            out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
        elif _digits(part):
            out.append(part)
        else:
            raise NodeListError(f"bad range item {part!r}")
    return out


def _expand_one(host: str) -> list[str]:
    i = host.find("[")
    if i < 0:
        if "]" in host:
            raise NodeListError(f"unbalanced ']' in {host!r}")
        return [host]
    j = host.find("]", i)
    if j < 0:
        raise NodeListError(f"unbalanced '[' in {host!r}")
    head, spec, tail = host[:i], host[i + 1:j], host[j + 1:]
    return [head + n + t for n in _range(spec) for t in _expand_one(tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list -> host names in order: ``node[01-03],gpu7`` ->
    ``['node01', 'node02', 'node03', 'gpu7']``; ``rack[1-2]-n[1-2]`` -> 4 hosts."""
    out: list[str] = []
    for item in _split_top(nodelist.strip()):
        out.extend(_expand_one(item))
    if not out:
        raise NodeListError(f"empty node list {nodelist!r}")
    return out


def first_host(nodelist: str) -> str:
    return expand_nodelist(nodelist)[0]


def under_srun(env: Mapping[str, str]) -> bool:
    """A task started by srun (a job step), not the batch script itself."""
    return bool(env.get("SLURM_JOB_ID")) and bool(env.get("SLURM_STEP_ID") or env.get("SLURM_PROCID"))


def slurm_nodes(env: Mapping[str, str]) -> dict[str, object] | None:
    """The multi-node options of this srun task, or None when not under srun on 2+ nodes.

    Returns {nnodes, node_rank, rdzv_id, rdzv_endpoint, tasks}; raises NodeListError on a
    malformed node list.
    """
    if not under_srun(env):
        return None
    try:
        nnodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        node_rank = int(env.get("SLURM_NODEID") or "0")
        tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or str(nnodes))
    except ValueError:
        return None
    if nnodes < 2:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    host = first_host(nodelist) if nodelist else "127.0.0.1"
    port = env.get("MASTER_PORT") or str(DEFAULT_PORT)
    return {"nnodes": nnodes, "node_rank": node_rank, "rdzv_id": str(env.get("SLURM_JOB_ID")),
            "rdzv_endpoint": f"{host}:{port}", "tasks": tasks}
