"""What collective failures print, and which rank's crash is its own (shared by both sides).

A rank that raises in its own code (a ValueError in its data path, an assertion) makes the
other ranks fail in their next collective: gloo says "Connection closed by peer", NCCL aborts
its communicator or its watchdog times out. Those later errors are consequences; the crash
that caused them is the run's failure (:func:`own_crash`). Never imports torch.
"""

from __future__ import annotations

import re
from typing import Any

# gloo, NCCL and TORCH_DISTRIBUTED_DEBUG=DETAIL on a collective mismatch
MISMATCH_TEXT = re.compile(r"Detected mismatch between collectives|size doesn't match expected size|"
                           r"collective mismatch|Mismatch between collective", re.I)
# a peer rank went away (crashed, killed)
PEER_GONE_TEXT = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                            r"NCCL communicator was aborted|remote process exited", re.I)
# a collective never completed
TIMEOUT_TEXT = re.compile(r"Watchdog caught collective operation timeout|"
                          r"Timed out waiting .* for collective", re.I)
COLLECTIVE_FAILURE_TEXT = re.compile(
    "|".join(p.pattern for p in (MISMATCH_TEXT, PEER_GONE_TEXT, TIMEOUT_TEXT))
    + r"|ProcessGroup|c10d|gloo|NCCL", re.I)
CONSEQUENT = re.compile("|".join(p.pattern for p in (MISMATCH_TEXT, PEER_GONE_TEXT, TIMEOUT_TEXT)),
                        re.I)


def own_crash(res: dict[str, Any]) -> bool:
    """The rank raised in its own code: not a collective failure caused by another rank."""
    if res.get("outcome") != "crash":
        return False
    exc = res.get("exception") or {}
    texts = [exc.get("message") or ""] + [c.get("message") or "" for c in exc.get("chain") or []]
    return not any(CONSEQUENT.search(t) for t in texts)
