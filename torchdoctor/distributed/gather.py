"""The end-of-run exchange of a multi-node job: every node's summary to node 0, through a TCP
store (torch's ``TCPStore``: the c10d rendezvous' own store type), no shared filesystem.

Node 0's agent hosts the store at the rendezvous host, port + 1 (``TORCHDOCTOR_GATHER_PORT``
overrides it), once its own torchrun has ended, and waits up to ``wait_s`` for the other nodes'
summaries; every other node's agent connects (retrying for up to ``wait_s`` while node 0 is still
running), sets its summary under ``torchdoctor/<rdzv id>/node<K>`` and goes on to print its own
section. torchrun's own store (on the rendezvous port) lives inside node 0's torchrun and is gone
when the ranks end, which is exactly when the evidence is complete; hence a store of our own.

What arrives is untrusted (any process that reaches the port could write there): it is parsed as
JSON only, size-capped, shape-checked by :mod:`torchdoctor.distributed.jobreport`, and rendered
through ``report/safe.py``. Imports torch (the store); only multi-node runs get here.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

MAX_BYTES = 8 * 1024 * 1024  # one node's summary; larger ones are refused (and reported)
POLL_S = 0.1


def key(rdzv_id: str, node_rank: int) -> str:
    return f"torchdoctor/{rdzv_id}/node{node_rank}"


def encode(summary: dict[str, Any]) -> bytes:
    return json.dumps(summary, default=str, separators=(",", ":")).encode()


def decode(blob: bytes) -> dict[str, Any] | None:
    if len(blob) > MAX_BYTES:
        return None
    try:
        data = json.loads(blob.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def collect(host: str, port: int, rdzv_id: str, nnodes: int, own: dict[str, Any],
            wait_s: float) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Node 0: host the store, wait up to ``wait_s`` for every other node's summary.

    Returns ({node rank: summary} including node 0's own, info {waited_s, error?, refused?}).
    """
    from torch.distributed import TCPStore

    got: dict[int, dict[str, Any]] = {0: own}
    info: dict[str, Any] = {"port": port}
    t0 = time.monotonic()
    try:
        store = TCPStore(host, port, None, True, timedelta(seconds=max(wait_s, 1.0)),
                         wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - port taken, bad host: said in the report
        info["error"] = f"could not open the gather store on port {port}: {type(e).__name__}: {e}"
        return got, info
    refused: dict[int, str] = {}
    try:
        while time.monotonic() - t0 < wait_s and len(got) + len(refused) < nnodes:
            for k in range(1, nnodes):
                if k in got or k in refused:
                    continue
                if store.check([key(rdzv_id, k)]):
                    data = decode(store.get(key(rdzv_id, k)))
                    if data is None:
                        refused[k] = "not a JSON object of at most 8 MiB"
                    else:
                        got[k] = data
            time.sleep(POLL_S)
    finally:
        del store  # closes the server: nothing of it outlives the call
    info["waited_s"] = round(time.monotonic() - t0, 2)
    if refused:
        info["refused"] = refused
    return got, info


def send(host: str, port: int, rdzv_id: str, node_rank: int, summary: dict[str, Any],
         wait_s: float) -> dict[str, Any]:
    """Node K > 0: hand the summary to node 0's store (retrying the connection for ``wait_s``).

    Returns {sent: bool, error?}."""
    from torch.distributed import TCPStore

    blob = encode(summary)
    if len(blob) > MAX_BYTES:
        return {"sent": False, "error": f"summary of {len(blob)} bytes exceeds {MAX_BYTES}"}
    try:
        store = TCPStore(host, port, None, False, timedelta(seconds=max(wait_s, 1.0)))
        store.set(key(rdzv_id, node_rank), blob)
        del store
    except Exception as e:  # noqa: BLE001 - node 0 gone or unreachable: said in the report
        return {"sent": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"sent": True}
