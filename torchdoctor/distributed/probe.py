"""`torchdoctor dist` without a script: its options and the views of what was gathered.

The self-test's report (gather -> judge -> self-test -> judge -> Report) is built in
:mod:`torchdoctor.pipeline.dist`; this module holds its options (:class:`DistOptions`, the
``--sizes`` parser), the choice of backend and ranks, and the ``metrics["dist"]`` views of the
environment and topology. Measurement (facts, topology, self-test) stays in its modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchdoctor.errors import DoctorError

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "GLOO_", "TORCH_DISTRIBUTED_DEBUG")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Labels set by NVIDIA container images, not NCCL settings (NCCL_VERSION names the image's
# libnccl, which torch's bundled NCCL may not be).
NOT_SETTINGS = ("NCCL_VERSION",)
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass
class DistOptions:
    nproc: int | None = None  # None: GPU count (nccl) or 2 (gloo)
    backend: str = "auto"  # auto | nccl | gloo
    selftest: bool = True
    timeout_s: float | None = None  # None: 180 s on GPUs, 60 s on CPU
    sizes: list[int] | None = None  # bytes; None: selftest defaults
    out_dir: str | None = None
    node: Any = None  # multinode.NodeSpec: this node's part of a multi-node self-test


def parse_sizes(text: str) -> list[int]:
    """'1M,16M,1G' -> bytes (K/M/G are powers of 1024). Multiples of 4 bytes (float32)."""
    out = []
    for part in text.split(","):
        s = part.strip().upper().removesuffix("B").removesuffix("I")
        if not s:
            continue
        unit = s[-1] if s[-1] in "KMG" else ""
        try:
            n = int(float(s[:-1] if unit else s) * UNITS[unit])
        except ValueError:
            raise DoctorError(f"cannot read size {part.strip()!r}", hint="e.g. --sizes 1M,64M,1G") from None
        if n < 4 or n % 4:
            raise DoctorError(f"size {part.strip()!r} must be a positive multiple of 4 bytes")
        out.append(n)
    if not out:
        raise DoctorError("--sizes is empty", hint="e.g. --sizes 1M,64M,1G")
    return sorted(set(out))


def choose_backend(opts: DistOptions, facts: dict) -> str:
    gpus = facts.get("cuda_device_count") or 0
    nccl_ok = bool(facts.get("cuda_available") and gpus and (facts.get("backends") or {}).get("nccl"))
    if opts.backend == "nccl" and not nccl_ok:
        raise DoctorError("--backend nccl needs CUDA GPUs and a torch build with NCCL",
                          hint="use --backend gloo to test CPU collectives")
    if opts.backend == "gloo" and facts.get("dist_available") and not (facts.get("backends") or {}).get("gloo"):
        raise DoctorError("this torch build has no gloo backend")
    if opts.backend in ("nccl", "gloo"):
        return opts.backend
    return "nccl" if nccl_ok else "gloo"


def choose_nproc(opts: DistOptions, backend: str, facts: dict) -> int:
    gpus = facts.get("cuda_device_count") or 0
    n = opts.nproc if opts.nproc is not None else (gpus if backend == "nccl" else 2)
    if n < 1:
        raise DoctorError(f"--nproc-per-node must be at least 1, not {n}")
    if backend == "nccl" and n > gpus:
        raise DoctorError(f"--nproc-per-node {n} exceeds the {gpus} visible GPU(s)",
                          hint="NCCL needs one GPU per rank; check CUDA_VISIBLE_DEVICES")
    return n


def env_view(env: dict[str, str]) -> dict:
    return {"launch": {k: env[k] for k in LAUNCH_VARS if k in env},
            "variables": {k: v for k, v in sorted(env.items())
                          if k.startswith(ENV_PREFIXES) and k not in NOT_SETTINGS}}


def topology_summary(topo: dict) -> dict:
    if not topo.get("available"):
        return {"available": False, "reason": topo.get("reason")}
    gpus = [{"index": g["nvml_index"], "name": g["name"], "uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"],
             "pcie": g["pcie"], "nvlink_links": g["nvlink"]["active_links"],
             "nvlink_speed_mbps": g["nvlink"]["speed_mbps_common"],
             "nvlink_versions": sorted({lk["version"] for lk in g["nvlink"]["links"] if lk["version"] is not None}),
             "nvlink_remote": sorted({str(lk["remote_type"]) for lk in g["nvlink"]["links"]})}
            for g in topo.get("gpus", [])]
    return {"available": True, "driver": topo.get("driver"), "gpus": gpus, "pairs": topo.get("pairs", [])}
