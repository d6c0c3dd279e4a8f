"""Gather the facts the distributed audit judges (impure; every probe returns None/[] on failure).

``gather_facts()`` returns a plain dict (JSON-safe), judged by the ``dist-env`` rules:
- ``torch``: version; ``dist_available``; ``backends`` {nccl, gloo, mpi, ucc: bool};
  ``nccl_version`` "2.27.3" or None; ``cuda_available``; ``cuda_device_count``;
- ``host``: ``ib_devices`` (names under /sys/class/infiniband), ``net_ifaces`` (names);
- ``master_addr_resolves``: True/False, or None when MASTER_ADDR is unset or the lookup
  did not answer within ``RESOLVE_TIMEOUT_S``.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

RESOLVE_TIMEOUT_S = 2.0


def torch_facts() -> dict:
    out: dict = {"torch": None, "dist_available": False, "backends": {}, "nccl_version": None,
                 "cuda_available": False, "cuda_device_count": 0}
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        out["torch_error"] = f"{type(e).__name__}: {e}"
        return out
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["cuda_device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
    except Exception as e:  # noqa: BLE001
        out["cuda_error"] = f"{type(e).__name__}: {e}"
    try:
        import torch.distributed as dist

        out["dist_available"] = bool(dist.is_available())
        if out["dist_available"]:
            for name in ("nccl", "gloo", "mpi", "ucc"):
                fn = getattr(dist, f"is_{name}_available", None)
                out["backends"][name] = bool(fn()) if fn else False
    except Exception as e:  # noqa: BLE001
        out["dist_error"] = f"{type(e).__name__}: {e}"
    if out["backends"].get("nccl"):
        try:
            v = torch.cuda.nccl.version()
            out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # noqa: BLE001
            out["nccl_error"] = f"{type(e).__name__}: {e}"
    return out


def host_facts() -> dict:
    ib = Path("/sys/class/infiniband")
    try:
        ib_devices = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    except OSError:
        ib_devices = []
    try:
        ifaces = sorted(name for _i, name in socket.if_nameindex())
    except OSError:
        ifaces = []
    return {"ib_devices": ib_devices, "net_ifaces": ifaces}


def resolves(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> bool | None:
    """Whether ``host`` resolves to an address; None if the resolver did not answer in time."""
    result: list[bool] = []

    def look() -> None:
        try:
            socket.getaddrinfo(host, None)
            result.append(True)
        except (OSError, UnicodeError):
            result.append(False)

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout_s)
    return result[0] if result else None


def gather_facts(env: dict[str, str] | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    facts = torch_facts()
    facts["host"] = host_facts()
    addr = env.get("MASTER_ADDR", "").strip()
    facts["master_addr_resolves"] = resolves(addr) if addr else None
    return facts
