"""What one node of a multi-node job is: host, versions, GPU model, NCCL_*/TORCH_* variables
(measurement, in the node's agent after its ranks ended; imports torch and NVML).

The cross-node rule ``node-env-mismatch`` compares these between nodes. Variables torchdoctor
sets on every node alike, torchrun's per-process ones and torchdoctor's own are left out.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping

ENV_PREFIXES = ("NCCL_", "TORCH_")
ENV_SKIP_PREFIXES = ("TORCHELASTIC_", "TORCHDOCTOR_")
MAX_VALUE = 300  # characters kept of one variable's value


def compared_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v[:MAX_VALUE] for k, v in sorted(env.items())
            if k.startswith(ENV_PREFIXES) and not k.startswith(ENV_SKIP_PREFIXES)}


def collect(env: Mapping[str, str] | None = None, gpu_names: list[str] | None = None) -> dict[str, Any]:
    """Facts of this node. ``gpu_names``: the models the ranks used (their ``device`` events);
    NVML's list of the host's GPUs otherwise."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {"hostname": socket.gethostname()}
    try:
        from torchdoctor.envinfo.torchinfo import torch_build

        b = torch_build()
        out.update(torch=b.get("version"), cuda=b.get("cuda"), nccl=b.get("nccl"))
    except Exception as e:  # noqa: BLE001 - a fact we could not read is left out, with why
        out["unavailable"] = {"torch": f"{type(e).__name__}: {e}"}
    if out.get("cuda"):
        try:
            from torchdoctor.envinfo.nvml import nvidia

            nv = nvidia()
            if nv.get("present"):
                out["driver"] = nv.get("driver")
                if not gpu_names:
                    gpu_names = [g.get("name") for g in nv.get("gpus") or [] if g.get("name")]
        except Exception as e:  # noqa: BLE001
            out.setdefault("unavailable", {})["driver"] = f"{type(e).__name__}: {e}"
    if gpu_names:
        out["gpu"] = ", ".join(sorted(set(str(n) for n in gpu_names)))
    out["env"] = compared_env(env)
    return out
