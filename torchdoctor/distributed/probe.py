"""`torchdoctor dist` without a script: gather -> judge -> self-test -> judge -> Report.

Measurement (facts, topology, self-test) stays in its modules and judgment in the rules of
probes ``dist-env`` (rules/dist_env.py, rules/dist_nccl_env.py) and ``dist-selftest``
(rules/dist_selftest.py), applied by the guarded ``judge()``; this module only builds their
evidence (distributed/evidence.py), wires them and fills ``report.metrics["dist"]``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from torchdoctor.errors import DoctorError
from torchdoctor.findings import Report

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


def run_dist(opts: DistOptions) -> Report:
    from torchdoctor.distributed import selftest, topology
    from torchdoctor.distributed.evidence import LaunchEvidence, SelftestEvidence
    from torchdoctor.distributed.facts import gather_facts
    from torchdoctor.judge import judge

    env = dict(os.environ)
    facts = gather_facts(env)
    if not facts.get("torch"):
        raise DoctorError("torch cannot be imported", hint=facts.get("torch_error"))
    backend = choose_backend(opts, facts)
    nproc = choose_nproc(opts, backend, facts)
    topo = topology.gather_topology()
    report = Report(command="dist", context=default_context())
    report.target = f"local node, {nproc} rank(s), {backend}"
    if opts.node is not None:
        report.target = (f"node {opts.node.node_rank} of {opts.node.nnodes}, {nproc} rank(s) each, "
                         f"{backend}")
    judge("dist-env", LaunchEvidence(env, facts, topo), report)
    dist_metrics: dict = {"torch": facts.get("torch"), "backends": facts.get("backends"),
                          "nccl_version": facts.get("nccl_version"),
                          "cuda_devices": facts.get("cuda_device_count"), "host": facts.get("host"),
                          **env_view(env), "topology": topology_summary(topo)}
    report.metrics["dist"] = dist_metrics
    if not opts.selftest:  # skipped under the names of the dist-selftest rules
        report.skip("collective-selftest", "--no-selftest")
        report.skip("allreduce-bandwidth-low", "--no-selftest")
        return report
    if not facts.get("dist_available"):
        report.skip("collective-selftest", "torch.distributed is not available")
        return report
    tmp = None
    if opts.out_dir:
        from torchdoctor.runner.outdir import fresh_subdir

        out = fresh_subdir(opts.out_dir, "dist-selftest")
    else:
        tmp = tempfile.mkdtemp(prefix="torchdoctor-dist-")
        out = Path(tmp)
    try:
        timeout = opts.timeout_s or (180.0 if backend == "nccl" else 60.0)
        extra = {"node": opts.node} if opts.node is not None else {}
        st = selftest.run_selftest(nproc, out, backend=backend, sizes=opts.sizes, timeout_s=timeout,
                                   **extra)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if opts.out_dir:
        report.artifacts["dist_selftest"] = str(out)
    used = None
    if backend == "nccl":
        devs = [r.get("device") or {} for r in st.get("ranks", [])]
        bus = [f"{d['pci']['domain']:04x}:{d['pci']['bus']:02x}:{d['pci']['device']:02x}.0"
               if d.get("pci") else None for d in devs]
        used = topology.select_gpus(topo, [d.get("uuid") for d in devs], bus, nproc)
    capacity = topology.link_capacity(topo, used)
    if opts.node is not None and opts.node.nnodes > 1:
        capacity = {}  # the job-wide sweep crosses the network: not judged against local links
    judge("dist-selftest", SelftestEvidence(st, capacity), report)
    if st.get("status") == "interrupted":
        report.run_status = "interrupted"
        report.metrics["run"] = {"outcome": "interrupted", "interrupted_by": st.get("interrupted_by"),
                                 "wall_s": st.get("wall_s")}
    dist_metrics["link_capacity"] = capacity
    dist_metrics["selftest"] = {k: v for k, v in st.items()
                                if k != "log_tail" and not (tmp and k == "log")}
    for r in dist_metrics["selftest"].get("ranks", []):
        r.pop("error_full", None)
        r.pop("stack", None)
    return report


def default_context() -> dict:
    """Header facts of the ``dist`` report: python, torch version, device (imports torch)."""
    import platform

    ctx = {"python": platform.python_version()}
    try:
        import torch

        ctx["torch"] = torch.__version__
        if torch.cuda.is_available():
            ctx["device"] = f"cuda ({torch.cuda.get_device_name(0)})"
        else:
            ctx["device"] = "cpu"
    except Exception as e:  # noqa: BLE001
        ctx["torch"] = f"unavailable ({type(e).__name__})"
    return ctx
