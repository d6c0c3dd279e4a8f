"""GPU topology from NVML, and the all-reduce link capacity it implies.

:func:`gather_topology` (impure, never raises) reads, per GPU: name, uuid, PCI bus id,
PCIe max/current generation and width, each NVLink's state, version, remote device type,
remote PCI bus id, and the common link speed; per GPU pair: the common ancestor level and
P2P read/NVLink status. :func:`link_capacity` (pure) turns that into the per-direction
bandwidth, in GB/s (1e9 B/s), that a ring all-reduce over a given set of GPUs can use —
the number nccl-tests' busbw is meant to be compared with.
"""

from __future__ import annotations

from typing import Any

# PCIe per-lane, per-direction payload rate in GB/s after line encoding
# (8b/10b for gen 1-2, 128b/130b for gen 3-5, FLIT/PAM4 for gen 6).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Per-link, per-direction NVLink bandwidth in GB/s by NVML's nvmlNvlinkVersion_t
# (NVML_NVLINK_VERSION_1_0 = 1 ... NVML_NVLINK_VERSION_5_0 = 7). Only a fallback: the
# measured link speed field (NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON) is preferred. Value 5
# is left out on purpose: older drivers return the bare generation (5 = NVLink 5, 50 GB/s)
# where the enum means NVLink 3.1 (25 GB/s).
NVLINK_VERSION_GBS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 6: 25.0, 7: 50.0}

TOPOLOGY_LEVELS = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches",
                   30: "host bridge", 40: "same NUMA node", 50: "across NUMA nodes"}
P2P_STATUS = {0: "ok", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}
FI_NVLINK_SPEED_MBPS_COMMON = 90
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_GET_SPEED = 164
NVLINK_DEVICE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 255: "unknown"}


def _try(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an unsupported query is "unknown", not a failure
        return default


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def norm_bus_id(bus_id: str | None) -> str | None:
    """NVML/PCI bus ids come as 00000000:18:00.0 or 0000:18:00.0: compare on the last 12 chars."""
    if not bus_id:
        return None
    return _str(bus_id).strip().lower()[-12:]


VALUE_ATTRS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_uint(nv, handle, field: int, scope: int | None = None) -> int | None:
    """An NVML field value as an int (None when unsupported or zero)."""
    vals = _try(nv.nvmlDeviceGetFieldValues, handle, [field if scope is None else (field, scope)])
    if not vals or vals[0].nvmlReturn != 0:
        return None
    x = getattr(vals[0].value, VALUE_ATTRS.get(vals[0].valueType, "uiVal"), None)
    return int(x) if x else None


def _gpu_facts(nv, i: int) -> tuple[Any, dict]:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    pci = _try(nv.nvmlDeviceGetPciInfo, h)
    g: dict[str, Any] = {
        "nvml_index": i,
        "name": _str(_try(nv.nvmlDeviceGetName, h, default="?")),
        "uuid": _str(_try(nv.nvmlDeviceGetUUID, h, default="")),
        "pci_bus_id": norm_bus_id(_str(pci.busId)) if pci is not None else None,
        "pcie": {"max_gen": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                 "max_width": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
                 "cur_gen": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                 "cur_width": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, h)},
    }
    links = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _try(nv.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            if link == 0:
                break  # no NVLink on this GPU (NOT_SUPPORTED)
            continue
        if not state:
            continue
        remote = _try(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        rtype = _try(nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        links.append({"link": link, "version": _try(nv.nvmlDeviceGetNvLinkVersion, h, link),
                      "remote_type": NVLINK_DEVICE_TYPES.get(rtype, rtype) if rtype is not None else None,
                      "remote_bus_id": norm_bus_id(_str(remote.busId)) if remote is not None else None})
    common = _field_uint(nv, h, FI_NVLINK_SPEED_MBPS_COMMON) if links else None
    # Per-link speed (scope = link index); what `nvidia-smi nvlink -s` prints.
    per_link = _field_uint(nv, h, FI_NVLINK_GET_SPEED, links[0]["link"]) if links else None
    g["nvlink"] = {"active_links": len(links), "speed_mbps_common": common or per_link,
                   "speed_fields": {"common": common, "link0": per_link}, "links": links}
    return h, g


def gather_topology() -> dict:
    """NVML facts about every GPU on the host; ``{"available": False, "reason": ...}`` without NVML."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001
        return {"available": False, "reason": f"NVML unavailable ({type(e).__name__})"}
    try:
        out: dict[str, Any] = {"available": True,
                               "driver": _str(_try(nv.nvmlSystemGetDriverVersion, default="?"))}
        n = nv.nvmlDeviceGetCount()
        handles, gpus = [], []
        for i in range(n):
            h, g = _gpu_facts(nv, i)
            handles.append(h)
            gpus.append(g)
        pairs = []
        for a in range(n):
            for b in range(a + 1, n):
                level = _try(nv.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
                p2p_read = _try(nv.nvmlDeviceGetP2PStatus, handles[a], handles[b], 0)
                p2p_nvlink = _try(nv.nvmlDeviceGetP2PStatus, handles[a], handles[b], 2)
                pairs.append({"a": a, "b": b, "level": level,
                              "level_name": TOPOLOGY_LEVELS.get(level) if level is not None else None,
                              "p2p_read": P2P_STATUS.get(p2p_read, p2p_read) if p2p_read is not None else None,
                              "p2p_nvlink": P2P_STATUS.get(p2p_nvlink, p2p_nvlink)
                              if p2p_nvlink is not None else None})
        out["gpus"] = gpus
        out["pairs"] = pairs
        return out
    except Exception as e:  # noqa: BLE001
        return {"available": False, "reason": f"NVML query failed ({type(e).__name__}: {e})"}
    finally:
        _try(nv.nvmlShutdown)


# --------------------------------------------------------------------------- judgment inputs
def nvlink_link_gbs(gpu: dict, link: dict) -> float | None:
    """Per-direction GB/s of one active link: the NVML common speed, else the version table."""
    speed = gpu.get("nvlink", {}).get("speed_mbps_common")
    if speed and 5_000 <= speed <= 400_000:  # MB/s; outside this range it is not a link speed
        return speed / 1000.0
    return NVLINK_VERSION_GBS.get(link.get("version"))


def pcie_gbs(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in PCIE_LANE_GBS:
        return None
    return PCIE_LANE_GBS[gen] * width


def select_gpus(topo: dict, uuids: list[str] | None, bus_ids: list[str] | None, count: int) -> list[dict] | None:
    """The NVML records of the GPUs the ranks used: by uuid, else PCI bus id, else (all GPUs
    used and no renumbering possible) the first ``count``. None when they cannot be matched."""
    gpus = topo.get("gpus") or []
    if uuids and all(uuids):
        by = {g["uuid"]: g for g in gpus}
        picked = [by.get(u) for u in uuids]
        if all(picked):
            return picked
    if bus_ids and all(bus_ids):
        by = {g["pci_bus_id"]: g for g in gpus}
        picked = [by.get(norm_bus_id(b)) for b in bus_ids]
        if all(picked):
            return picked
    if count == len(gpus):
        return list(gpus)
    return None


def link_capacity(topo: dict, used: list[dict] | None) -> dict:
    """Per-direction bandwidth (GB/s) a ring all-reduce over ``used`` GPUs can use.

    NVLink: per GPU, the active links that reach an NVSwitch or another used GPU, times
    the per-link speed; the slowest GPU bounds the ring. Else PCIe, when every pair has
    P2P: the slowest GPU's max generation x width. Returns
    ``{"gbs": float|None, "kind": "nvlink"|"pcie"|None, "basis": str, "reason": str}``:
    ``gbs`` None means unknown (the bandwidth rule then skips, it does not guess).
    """
    if not topo.get("available"):
        return {"gbs": None, "kind": None, "basis": "", "reason": topo.get("reason", "no NVML")}
    if not used or len(used) < 2:
        return {"gbs": None, "kind": None, "basis": "", "reason": "fewer than 2 GPUs matched in NVML"}
    used_bus = {g["pci_bus_id"] for g in used}
    per_gpu = []
    for g in used:
        links = [lk for lk in g.get("nvlink", {}).get("links", [])
                 if lk.get("remote_type") == "switch" or lk.get("remote_bus_id") in used_bus - {g["pci_bus_id"]}]
        speeds = [nvlink_link_gbs(g, lk) for lk in links]
        if not links or any(s is None for s in speeds):
            per_gpu = None
            break
        per_gpu.append((sum(speeds), len(links), speeds[0]))
    if per_gpu:
        gbs, nlinks, one = min(per_gpu)
        return {"gbs": round(gbs, 2), "kind": "nvlink", "reason": "",
                "basis": f"{nlinks} NVLink links x {one:g} GB/s per direction (slowest GPU)"}
    idx = {g["nvml_index"] for g in used}
    pairs = [p for p in topo.get("pairs", []) if p["a"] in idx and p["b"] in idx]
    if not pairs or any(p.get("p2p_read") != "ok" for p in pairs):
        return {"gbs": None, "kind": None, "basis": "",
                "reason": "no NVLink and no PCIe P2P between the GPUs: host-staged path, capacity unknown"}
    rates = [(pcie_gbs(g["pcie"].get("max_gen"), g["pcie"].get("max_width")), g) for g in used]
    if any(r is None for r, _ in rates):
        return {"gbs": None, "kind": None, "basis": "", "reason": "PCIe generation/width unreadable"}
    gbs, g = min(rates, key=lambda t: t[0])
    return {"gbs": round(gbs, 2), "kind": "pcie", "reason": "",
            "basis": f"PCIe gen{g['pcie']['max_gen']} x{g['pcie']['max_width']} per direction (slowest GPU)"}
