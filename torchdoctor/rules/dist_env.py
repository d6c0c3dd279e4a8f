"""Launch-environment rules of `torchdoctor dist` (probe ``dist-env``): launch variables, backends.

Pure functions of :class:`~torchdoctor.distributed.evidence.LaunchEvidence` (the process
environment, ``facts.gather_facts()``'s dict, the NVML topology): no I/O, testable on
synthetic dicts. Codes: ``dist-env-inconsistent`` (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
missing or contradictory), ``nccl-unavailable`` (CUDA GPUs but no usable NCCL; the self-test
raises it too, rules/dist_selftest.py). The NCCL_*/TORCH_NCCL_* variables: rules/dist_nccl_env.py.
"""

from __future__ import annotations

from typing import Any, Mapping

from torchdoctor.catalog import declare
from torchdoctor.distributed.evidence import LaunchEvidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import rule
from torchdoctor.skills import DISTRIBUTED

DIST_ENV_INCONSISTENT = declare(
    "dist-env-inconsistent", DISTRIBUTED, "error",
    "RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT missing or contradictory")
NCCL_UNAVAILABLE = declare(
    "nccl-unavailable", DISTRIBUTED, "error",
    "CUDA present but NCCL backend unusable")

LAUNCH_INTS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def as_int(v: str | None) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- launch variables
def launch_problems(env: Mapping[str, str], facts: Mapping[str, Any]) -> list[tuple[str, dict, str]]:
    """(title, evidence, fix) for each missing or contradictory launch variable."""
    out: list[tuple[str, dict, str]] = []
    present = {k: env[k] for k in (*LAUNCH_INTS, "MASTER_ADDR") if k in env}
    vals = {}
    for k in LAUNCH_INTS:
        if k in env:
            vals[k] = as_int(env[k])
            if vals[k] is None:
                out.append((f"{k}={env[k]!r} is not an integer", {"variables": present},
                            f"Set {k} to an integer (torchrun sets it for every worker)."))
    rank, world = vals.get("RANK"), vals.get("WORLD_SIZE")
    local, local_world = vals.get("LOCAL_RANK"), vals.get("LOCAL_WORLD_SIZE")
    launcher_fix = ("Launch with torchrun (python -m torch.distributed.run), which sets RANK, WORLD_SIZE, "
                    "LOCAL_RANK, MASTER_ADDR and MASTER_PORT consistently, or export them together.")
    if ("RANK" in env) != ("WORLD_SIZE" in env):
        have, miss = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        out.append((f"{have} is set but {miss} is not: init_process_group(env://) cannot start",
                    {"variables": present}, launcher_fix))
    if world is not None and world < 1:
        out.append((f"WORLD_SIZE={world} is below 1", {"variables": present}, launcher_fix))
    if rank is not None and rank < 0:
        out.append((f"RANK={rank} is negative", {"variables": present}, launcher_fix))
    if rank is not None and world is not None and world >= 1 and rank >= world:
        out.append((f"RANK={rank} is not below WORLD_SIZE={world}: this rank never joins",
                    {"variables": present}, launcher_fix))
    if local is not None and local < 0:
        out.append((f"LOCAL_RANK={local} is negative", {"variables": present}, launcher_fix))
    if local is not None and local_world is not None and local >= local_world:
        out.append((f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_world}",
                    {"variables": present}, launcher_fix))
    if local_world is not None and world is not None and local_world > world >= 1:
        out.append((f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}",
                    {"variables": present}, launcher_fix))
    if local is not None and rank is not None and 0 <= rank < local:
        out.append((f"LOCAL_RANK={local} exceeds RANK={rank} (a node's first rank is at least its "
                    "local rank)", {"variables": present}, launcher_fix))
    ngpu = int(facts.get("cuda_device_count") or 0)
    if local is not None and facts.get("cuda_available") and ngpu > 0 and local >= ngpu:
        out.append((f"LOCAL_RANK={local} but only {ngpu} GPU(s) are visible: cuda:{local} does not exist",
                    {"variables": present, "visible_gpus": ngpu,
                     "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES")},
                    "Run at most one process per visible GPU (--nproc-per-node <= GPU count) and check "
                    "CUDA_VISIBLE_DEVICES."))
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
    if world is not None and world > 1 and missing:
        out.append((f"WORLD_SIZE={world} but {' and '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not set: the env:// rendezvous has no address",
                    {"variables": present},
                    f"Export {' and '.join(missing)} (rank 0's address and a free port), or launch with "
                    "torchrun."))
    port = vals.get("MASTER_PORT")
    if port is not None and not 1 <= port <= 65535:
        out.append((f"MASTER_PORT={port} is not a TCP port (1-65535)", {"variables": present},
                    "Pick a free port between 1024 and 65535 on rank 0's host."))
    if env.get("MASTER_ADDR", "").strip() and facts.get("master_addr_resolves") is False:
        out.append((f"MASTER_ADDR={env['MASTER_ADDR']!r} does not resolve to an address on this host",
                    {"variables": present},
                    "Use rank 0's IP address or a host name every node can resolve."))
    elif "MASTER_ADDR" in env and not env["MASTER_ADDR"].strip():
        out.append(("MASTER_ADDR is set but empty", {"variables": present}, launcher_fix))
    return out


@rule("dist-launch-env", probes={"dist-env"}, needs={"env", "facts"}, raises=[DIST_ENV_INCONSISTENT])
def launch_env(ev: LaunchEvidence) -> list[Finding]:
    return [finding("dist-env-inconsistent", t, e, fix) for t, e, fix in launch_problems(ev.env, ev.facts)]


# --------------------------------------------------------------------------- backends
@rule("dist-nccl-backend", probes={"dist-env"}, needs={"facts"}, raises=[NCCL_UNAVAILABLE])
def nccl_backend(ev: LaunchEvidence) -> list[Finding]:
    """nccl-unavailable when torch sees CUDA GPUs but cannot use NCCL."""
    facts = ev.facts
    if not facts.get("cuda_available") or not facts.get("cuda_device_count"):
        return []
    base = {"torch": facts.get("torch"), "cuda_devices": facts.get("cuda_device_count"),
            "backends": facts.get("backends")}
    if not facts.get("dist_available"):
        return [finding("nccl-unavailable", "torch.distributed is not available in this torch build",
                        {**base, "error": facts.get("dist_error")},
                        "Install a torch wheel built with distributed support (the official Linux CUDA "
                        "wheels are).")]
    if not (facts.get("backends") or {}).get("nccl"):
        return [finding("nccl-unavailable", "CUDA GPUs are visible but this torch build has no NCCL backend",
                        base, "Install an official Linux CUDA wheel of torch (it bundles NCCL); use gloo only "
                              "for CPU tensors.")]
    if facts.get("nccl_error"):
        return [finding("nccl-unavailable", "the NCCL library torch links against cannot be loaded",
                        {**base, "error": facts["nccl_error"]},
                        "Check that the nvidia-nccl-cu* package matches torch's CUDA version; do not point "
                        "LD_LIBRARY_PATH at another libnccl.")]
    return []
