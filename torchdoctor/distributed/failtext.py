"""What collective failures print, and which rank's crash is its own (shared by both sides).

A rank that raises in its own code (a ValueError in its data path, an assertion) makes the
other ranks fail in their next collective: gloo says "Connection closed by peer", NCCL aborts
its communicator or its watchdog times out. Those later errors are consequences; the crash
that caused them is the run's failure (:func:`own_crash`). The texts are rows of the one
error-text table (``torchdoctor/errortext/table.py``, the groups below). Never imports torch.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.errortext.match import groups, matches

# gloo, NCCL and TORCH_DISTRIBUTED_DEBUG=DETAIL on a collective mismatch
MISMATCH = groups("collective-mismatch")
# a peer rank went away (crashed, killed)
PEER_GONE = groups("peer-gone")
# a collective never completed
TIMEOUT = groups("collective-timeout")
# a consequence of another rank's failure
CONSEQUENT = MISMATCH + PEER_GONE + TIMEOUT
# any collective failure, or a line that names the transport (ProcessGroup, c10d, gloo, NCCL)
COLLECTIVE_FAILURE = CONSEQUENT + groups("collective-transport")


def own_crash(res: dict[str, Any]) -> bool:
    """The rank raised in its own code: not a collective failure caused by another rank."""
    if res.get("outcome") != "crash":
        return False
    exc = res.get("exception") or {}
    texts = [exc.get("message") or ""] + [c.get("message") or "" for c in exc.get("chain") or []]
    return not any(matches(t, CONSEQUENT) for t in texts)
