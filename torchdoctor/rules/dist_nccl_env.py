"""NCCL_* / TORCH_NCCL_* settings of `torchdoctor dist` (probe ``dist-env``): ``nccl-env-risky``.

One pure rule over :class:`~torchdoctor.distributed.evidence.LaunchEvidence`: the per-variable
checks are a data table (``VARIABLE_CHECKS``: variable -> check of its value in context) plus the
torch-side cvars (:func:`torch_nccl_risks`). A variable is only flagged where it can bite.

Variable names and semantics come from the PyTorch and NCCL sources:
torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (TORCH_NCCL_* and their deprecated
NCCL_* aliases; the TORCH_ name wins when both are set, Utils.hpp getCvar*), and NCCL's
environment-variable documentation.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from torchdoctor.catalog import declare
from torchdoctor.distributed.evidence import LaunchEvidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import rule
from torchdoctor.rules.dist_env import as_int
from torchdoctor.skills import DISTRIBUTED

# NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS at or below this cannot fill NVLink or a fast NIC
# (1 channel: 21 GB/s of 330 on 2xH200, docs/findings/nccl-env-risky.md)
LOW_CHANNELS = 2

NCCL_ENV_RISKY = declare(
    "nccl-env-risky", DISTRIBUTED, "warning",
    "NCCL variables that cripple or hide (e.g. NCCL_P2P_DISABLE=1, deprecated names)",
    thresholds={"LOW_CHANNELS": LOW_CHANNELS})

# Deprecated alias -> the name ProcessGroupNCCL reads first (ProcessGroupNCCL.hpp).
DEPRECATED = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
}
# Boolean cvars parsed by getCvarBool: any other value makes ProcessGroupNCCL refuse to start.
TORCH_BOOLS = ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_DESYNC_DEBUG", "TORCH_NCCL_ENABLE_TIMING",
               "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_DUMP_ON_TIMEOUT",
               "TORCH_NCCL_PROPAGATE_ERROR", "TORCH_NCCL_RETHROW_CUDA_ERRORS",
               "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_NAN_CHECK",
               "TORCH_NCCL_HIGH_PRIORITY", "TORCH_NCCL_CUDA_EVENT_CACHE")
TRUE = {"y", "yes", "1", "t", "true"}
FALSE = {"n", "no", "0", "f", "false"}


def torch_bool(v: str | None) -> bool | None:
    """getCvarBool's parse: True/False, or None when unset or not a recognised value."""
    if v is None:
        return None
    s = v.strip().lower()
    return True if s in TRUE else False if s in FALSE else None


def cvar(env: Mapping[str, str], name: str) -> tuple[str | None, str | None]:
    """(value, variable actually read) for a TORCH_NCCL_* name and its deprecated alias."""
    if name in env:
        return env[name], name
    for old, new in DEPRECATED.items():
        if new == name and old in env:
            return env[old], old
    return None, None


# --------------------------------------------------------------------------- per-variable checks
Risk = tuple[str, str, str, str]  # (severity, title, effect, fix)


def _ctx(env: Mapping[str, str], facts: Mapping[str, Any], topo: Mapping[str, Any] | None) -> dict:
    host = facts.get("host") or {}
    world, local_world = as_int(env.get("WORLD_SIZE")), as_int(env.get("LOCAL_WORLD_SIZE"))
    pairs = (topo or {}).get("pairs") or []
    return {
        "gpus": int(facts.get("cuda_device_count") or 0),
        "ib": list(host.get("ib_devices") or []),
        "ifaces": list(host.get("net_ifaces") or []),
        "single_node": world is not None and local_world is not None and world == local_world,
        "p2p_missing": any(p.get("p2p_read") not in (None, "ok") for p in pairs),
    }


def _p2p_disable(v, env, c) -> Risk | None:
    if as_int(v) and c["gpus"] >= 2:
        return ("warning", "NCCL_P2P_DISABLE=1: GPU-to-GPU traffic is staged through host memory",
                f"{c['gpus']} GPUs here lose NVLink/PCIe peer-to-peer transfers",
                "Unset NCCL_P2P_DISABLE; if it was set to dodge a hang, fix the IOMMU/ACS setting or "
                "driver instead.")
    return None


def _p2p_level(v, env, c) -> Risk | None:
    if v.strip().upper() in ("LOC", "0") and c["gpus"] >= 2:
        return ("warning", f"NCCL_P2P_LEVEL={v}: peer-to-peer is never used",
                "same effect as NCCL_P2P_DISABLE=1", "Unset NCCL_P2P_LEVEL (NCCL picks the level from "
                                                      "the topology).")
    return None


def _shm_disable(v, env, c) -> Risk | None:
    p2p_off = bool(as_int(env.get("NCCL_P2P_DISABLE"))) or env.get("NCCL_P2P_LEVEL", "").upper() in ("LOC", "0")
    if as_int(v) and c["gpus"] >= 2 and (p2p_off or c["p2p_missing"]):
        return ("warning", "NCCL_SHM_DISABLE=1 while peer-to-peer is unavailable: intra-node traffic "
                           "goes through the network stack",
                "no P2P and no shared memory leaves sockets/IB loopback for GPUs of one host",
                "Unset NCCL_SHM_DISABLE (and NCCL_P2P_DISABLE).")
    return None


def _multi_node_ib(var: str, bad: Callable[[str], bool], effect: str):
    def check(v, env, c) -> Risk | None:
        if bad(v) and c["ib"] and not c["single_node"]:
            return ("warning", f"{var}={v} on a host with InfiniBand ({', '.join(c['ib'][:4])})",
                    effect, f"Unset {var} so NCCL uses the InfiniBand adapters between nodes.")
        return None
    return check


def _nchannels(v, env, c) -> Risk | None:
    n = as_int(v)
    if n is not None and n <= LOW_CHANNELS:
        return ("warning", f"NCCL channels capped at {n}",
                "each channel is one ring/tree using a share of the links: 1-2 channels cannot fill "
                "NVLink or a fast NIC", "Unset the cap (NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS), or raise it "
                                        "only as far as compute overlap needs.")
    return None


def _debug(v, env, c) -> Risk | None:
    if v.strip().upper() == "TRACE":
        return ("warning", "NCCL_DEBUG=TRACE: NCCL logs every call",
                "per-call replayable traces slow every collective and flood the logs",
                "Use NCCL_DEBUG=WARN (or INFO at start-up only) outside a debugging session.")
    return None


def _forced(var: str):
    def check(v, env, c) -> Risk | None:
        return ("info", f"{var}={v} overrides NCCL's own tuning",
                "NCCL chooses algorithm/protocol per message size and topology; a forced choice is "
                "often slower at other sizes", f"Unset {var} unless a measurement on this machine "
                                                 "shows it helps.")
    return check


def _ifname(var: str, prefix_match: bool):
    def check(v, env, c) -> Risk | None:
        spec = v.strip()
        if not c["ifaces"] or not spec or spec.startswith("^"):
            return None  # exclusion lists always leave something; unknown interfaces: no judgment
        exact = not prefix_match or spec.startswith("=")
        names = [s.strip() for s in spec.lstrip("=").split(",") if s.strip()]
        hit = [n for n in names if any(i == n if exact else i.startswith(n) for i in c["ifaces"])]
        if not hit:
            return ("warning", f"{var}={v} matches no network interface on this host",
                    f"interfaces here: {', '.join(c['ifaces'][:8])}; rendezvous/bootstrap fails or hangs",
                    f"Set {var} to an interface that exists on every node (e.g. one of "
                    f"{', '.join(i for i in c['ifaces'] if i != 'lo')[:60] or 'the above'}).")
        return None
    return check


def _torch_debug(v, env, c) -> Risk | None:
    if v.strip().upper() == "DETAIL":
        return ("info", "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective",
                "each collective is preceded by a cross-rank shape check (measured ≈ 7x the cost of "
                "a small gloo collective)", "Keep DETAIL for diagnosis runs; unset it for training.")
    return None


# variable -> check(value, env, context): the data table of NCCL settings
VARIABLE_CHECKS: dict[str, Callable[[str, Mapping[str, str], dict], Risk | None]] = {
    "NCCL_P2P_DISABLE": _p2p_disable,
    "NCCL_P2P_LEVEL": _p2p_level,
    "NCCL_SHM_DISABLE": _shm_disable,
    "NCCL_IB_DISABLE": _multi_node_ib("NCCL_IB_DISABLE", lambda v: bool(as_int(v)),
                                      "NCCL falls back to TCP sockets between nodes"),
    "NCCL_NET": _multi_node_ib("NCCL_NET", lambda v: v.strip().lower() == "socket",
                               "NCCL uses TCP sockets between nodes instead of InfiniBand"),
    "NCCL_NET_GDR_LEVEL": _multi_node_ib("NCCL_NET_GDR_LEVEL", lambda v: v.strip().upper() in ("LOC", "0"),
                                         "GPUDirect RDMA is off: inter-node traffic is staged through "
                                         "host memory"),
    "NCCL_MAX_NCHANNELS": _nchannels,
    "NCCL_MAX_CTAS": _nchannels,
    "NCCL_DEBUG": _debug,
    "NCCL_ALGO": _forced("NCCL_ALGO"),
    "NCCL_PROTO": _forced("NCCL_PROTO"),
    "NCCL_SOCKET_IFNAME": _ifname("NCCL_SOCKET_IFNAME", prefix_match=True),
    "GLOO_SOCKET_IFNAME": _ifname("GLOO_SOCKET_IFNAME", prefix_match=False),
    "TORCH_DISTRIBUTED_DEBUG": _torch_debug,
}


def torch_nccl_risks(env: Mapping[str, str]) -> list[tuple[str, str, Risk]]:
    """(variable, value, risk) for TORCH_NCCL_* settings that hide errors or cost speed."""
    out: list[tuple[str, str, Risk]] = []
    v, name = cvar(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if v is not None and as_int(v) == 0:
        out.append((name, v, ("warning", f"{name}=0: NCCL errors and timeouts are not handled",
                              "a failed or timed-out collective leaves every rank hanging instead of "
                              "aborting the job", "Unset it (default 3: abort the process on error).")))
    v = env.get("TORCH_NCCL_ENABLE_MONITORING")
    if v is not None and torch_bool(v) is False:
        out.append(("TORCH_NCCL_ENABLE_MONITORING", v,
                    ("warning", "TORCH_NCCL_ENABLE_MONITORING=0: a stuck NCCL watchdog is never aborted",
                     "a hang inside CUDA/NCCL keeps the job (and its GPUs) stuck indefinitely",
                     "Unset it; raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC instead if the monitor fires "
                     "too early.")))
    v, name = cvar(env, "TORCH_NCCL_BLOCKING_WAIT")
    if v is not None and torch_bool(v):
        out.append((name, v, ("info", f"{name}=1: every wait() blocks the host until the collective ends",
                              "the CPU cannot run ahead to queue the next kernels while NCCL works",
                              "Unset it outside debugging; the process-group timeout still applies.")))
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        v = env.get(var)
        if v is not None and as_int(v) == 0:
            out.append((var, v, ("info", f"{var}=0: the NCCL flight recorder is off",
                                 "a hang leaves no record of which collective each rank was in",
                                 "Unset it (default 2000 entries) so hangs can be diagnosed.")))
    for var in TORCH_BOOLS:
        v = env.get(var)
        if v is not None and torch_bool(v) is None:
            out.append((var, v, ("warning", f"{var}={v!r} is not a boolean torch accepts",
                                 "ProcessGroupNCCL refuses to start (\"Invalid value for environment "
                                 "variable\")", f"Use 1 or 0 for {var}.")))
    for old, new in DEPRECATED.items():
        if old in env:
            shadowed = new in env and env[new] != env[old]
            effect = (f"ignored: {new}={env[new]} takes precedence" if shadowed
                      else f"still read as {new}, with a deprecation warning; it will stop working")
            out.append((old, env[old], ("warning", f"{old} is deprecated; torch reads {new}", effect,
                                        f"Rename {old} to {new}.")))
    return out


@rule("dist-nccl-env", probes={"dist-env"}, needs={"env", "facts", "topology"}, raises=[NCCL_ENV_RISKY])
def nccl_env(ev: LaunchEvidence) -> list[Finding]:
    env = ev.env
    c = _ctx(env, ev.facts, ev.topology)
    found: list[tuple[str, str, Risk]] = []
    for var, check in VARIABLE_CHECKS.items():
        if var in env:
            risk = check(env[var], env, c)
            if risk:
                found.append((var, env[var], risk))
    found += torch_nccl_risks(env)
    return [finding("nccl-env-risky", title, {"variable": var, "value": value, "effect": effect},
                    fix, severity=sev) for var, value, (sev, title, effect, fix) in found]
