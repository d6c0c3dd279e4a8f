"""The end-of-run exchange of a multi-node job: every node's summary to node 0 over one TCP port
of node 0's agent, no shared filesystem, no torch.

Node 0's agent listens at port + 1 of the rendezvous endpoint (``TORCHDOCTOR_GATHER_PORT``
overrides it) once its own torchrun has ended, and waits up to ``wait_s`` for the other nodes'
summaries; every other node's agent connects (retrying for up to ``wait_s`` while node 0 is
still running), sends its summary and goes on to print its own section. torchrun's own store
lives inside node 0's torchrun and is gone when the ranks end, which is exactly when the
evidence is complete; hence a port of our own.

The protocol (one connection per summary): the sender writes one header line
``TDGATHER1 <rdzv id> <node rank> <bytes>\\n`` then the summary's JSON; node 0 answers
``OK\\n`` or ``NO <why>\\n``. Anyone who reaches the port may write to it, so node 0 bounds what it
reads before it reads it:

- ``wait_s`` is the whole wait, from the moment the port opens, whatever arrives (stray bytes,
  slow or silent connections): nothing a client sends extends it;
- a header is at most ``HEADER_BYTES``; a claim is read only for this job's id, a node rank in
  1..N-1 that has not already sent (and is not being received), and at most ``MAX_BYTES``
  (one node's summary) within what is left of ``MAX_TOTAL_BYTES`` (the whole job); anything
  else is answered ``NO`` and closed unread;
- at most ``MAX_CONNECTIONS`` connections are open at once (more are closed at accept).

What is read is bytes only: :mod:`torchdoctor.distributed.peer` parses it under its bounds and
checks it against the schema; a summary that fails becomes a finding about that node.
"""

from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Any

from torchdoctor.distributed.peer import MAX_BYTES

MAGIC = "TDGATHER1"
HEADER_BYTES = 256
MAX_TOTAL_BYTES = 128 * 1024 * 1024  # every node's summary together
MAX_CONNECTIONS = 64  # open at once (headers not yet read included)
POLL_S = 0.05
RETRY_S = 0.2  # a sender's pause between connection attempts


def encode(summary: dict[str, Any]) -> bytes:
    return json.dumps(summary, default=str, separators=(",", ":")).encode()


class _Conn:
    __slots__ = ("sock", "buf", "node", "size")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf, self.node, self.size = sock, bytearray(), None, 0


class _Gather:
    """Node 0's side: one listening socket, a selector, the bounds of the module docstring."""

    def __init__(self, rdzv_id: str, nnodes: int) -> None:
        self.rdzv_id, self.nnodes = rdzv_id, nnodes
        self.got: dict[int, bytes] = {}
        self.inflight: dict[int, int] = {}  # node → bytes claimed
        self.refused: dict[int, str] = {}  # node → why its claim was refused (the last one)
        self.claimed_again: dict[int, int] = {}  # node → claims after its summary arrived
        self.contended: dict[int, int] = {}  # node → claims while another one was arriving
        self.stray = 0  # connections that claimed no node of this job (or too many at once)
        self.sel = selectors.DefaultSelector()
        self.conns: set[_Conn] = set()

    def budget_left(self) -> int:
        return MAX_TOTAL_BYTES - sum(map(len, self.got.values())) - sum(self.inflight.values())

    def done(self) -> bool:
        return len(self.got) >= self.nnodes - 1

    def accept(self, srv: socket.socket) -> None:
        try:
            sock, _ = srv.accept()
        except OSError:
            return
        if len(self.conns) >= MAX_CONNECTIONS:
            self.stray += 1
            sock.close()
            return
        sock.setblocking(False)
        c = _Conn(sock)
        self.conns.add(c)
        self.sel.register(sock, selectors.EVENT_READ, c)

    def close(self, c: _Conn, answer: str | None = None) -> None:
        if c.node is not None and c.node not in self.got:
            self.inflight.pop(c.node, None)
        if answer:
            try:
                c.sock.send(answer.encode() + b"\n")
            except OSError:
                pass
        self.sel.unregister(c.sock)
        self.conns.discard(c)
        c.sock.close()

    def read(self, c: _Conn) -> None:
        want = (HEADER_BYTES - len(c.buf)) if c.node is None else (c.size - len(c.buf))
        try:
            chunk = c.sock.recv(min(max(want, 1), 1 << 20))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # closed before its summary was complete
            if c.node is None:
                self.stray += 1
            return self.close(c)
        c.buf += chunk
        if c.node is None:
            self.header(c)
        elif len(c.buf) >= c.size:
            self.got[c.node] = bytes(c.buf[:c.size])
            self.inflight.pop(c.node, None)
            self.close(c, "OK")

    def header(self, c: _Conn) -> None:
        line, nl, rest = bytes(c.buf).partition(b"\n")
        if not nl:
            if len(c.buf) >= HEADER_BYTES:
                self.stray += 1
                self.close(c, "NO not a torchdoctor gather header")
            return
        parts = line.decode("utf-8", "replace").split(" ")
        ok = (len(parts) == 4 and parts[0] == MAGIC and parts[1] == self.rdzv_id
              and all(p.isascii() and p.isdigit() and len(p) < 12 for p in parts[2:]))
        if not ok or not 0 < int(parts[2]) < self.nnodes:
            self.stray += 1
            return self.close(c, "NO not a node of this job")
        node, size = int(parts[2]), int(parts[3])
        if node in self.got:
            self.claimed_again[node] = self.claimed_again.get(node, 0) + 1
            return self.close(c, f"NO node {node} has already sent its summary")
        if node in self.inflight:
            self.contended[node] = self.contended.get(node, 0) + 1
            return self.close(c, f"NO node {node} is being received")
        if size > MAX_BYTES or size > self.budget_left():
            self.refused[node] = (f"its summary of {size} bytes exceeds the bound of {MAX_BYTES} per node"
                                  if size > MAX_BYTES else
                                  f"its summary of {size} bytes exceeds what is left of the "
                                  f"{MAX_TOTAL_BYTES}-byte bound for the whole job")
            return self.close(c, "NO too large")
        c.node, c.size, c.buf = node, size, bytearray(rest[:size])
        self.inflight[node] = size
        if len(c.buf) >= size:
            self.got[node] = bytes(c.buf)
            self.inflight.pop(node, None)
            self.close(c, "OK")

    def run(self, srv: socket.socket, deadline: float) -> None:
        srv.setblocking(False)
        self.sel.register(srv, selectors.EVENT_READ, None)
        while not self.done():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for k, _ in self.sel.select(timeout=min(POLL_S, left)):
                if k.data is None:
                    self.accept(srv)
                else:
                    self.read(k.data)
        for c in list(self.conns):
            if c.node is not None and c.node not in self.got:
                self.refused[c.node] = (f"its summary was still arriving when node 0's wait ended "
                                        f"({len(c.buf)} of {c.size} bytes)")
            self.close(c)
        self.sel.close()


def listen(port: int) -> socket.socket:
    """A socket listening on ``port`` of every interface (IPv6 and IPv4 where the host has both)."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=MAX_CONNECTIONS)
        except OSError:
            pass
    return socket.create_server(("", port), backlog=MAX_CONNECTIONS)


def collect(port: int, rdzv_id: str, nnodes: int, wait_s: float) -> tuple[dict[int, bytes], dict[str, Any]]:
    """Node 0: open the port, read every other node's summary (bytes) for at most ``wait_s``.

    Returns ({node rank: summary bytes}, info {port, waited_s, error?, refused?, claimed_again?,
    claimed_while_arriving?, stray_connections?}); nothing raises."""
    info: dict[str, Any] = {"port": port}
    t0 = time.monotonic()
    try:
        srv = listen(port)
    except (OSError, OverflowError) as e:  # port taken or out of range: said in the report
        info["error"] = f"could not open the gather port {port}: {type(e).__name__}: {e}"
        return {}, info
    g = _Gather(rdzv_id, nnodes)
    try:
        g.run(srv, t0 + wait_s)
    finally:
        srv.close()
    info["waited_s"] = round(time.monotonic() - t0, 2)
    if g.refused:
        info["refused"] = {k: v for k, v in g.refused.items() if k not in g.got}
    if g.claimed_again:
        info["claimed_again"] = g.claimed_again
    if g.contended:
        info["claimed_while_arriving"] = g.contended
    if g.stray:
        info["stray_connections"] = g.stray
    return g.got, info


def send(host: str, port: int, rdzv_id: str, node_rank: int, summary: dict[str, Any],
         wait_s: float) -> dict[str, Any]:
    """Node K > 0: hand the summary to node 0 (retrying the connection for ``wait_s``).

    Returns {sent: bool, error?}; nothing raises."""
    blob = encode(summary)
    if len(blob) > MAX_BYTES:
        return {"sent": False, "error": f"summary of {len(blob)} bytes exceeds {MAX_BYTES}"}
    head = f"{MAGIC} {rdzv_id} {node_rank} {len(blob)}\n".encode()
    deadline = time.monotonic() + wait_s
    err = "node 0 did not answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"sent": False, "error": err}
        try:
            s = socket.create_connection((host, port), timeout=min(left, 10.0))
        except OSError as e:  # not listening yet (node 0 still running), unreachable
            err = f"{type(e).__name__}: {str(e)[:300]}"
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        try:
            with s:
                s.settimeout(max(0.5, deadline - time.monotonic()))
                s.sendall(head + blob)
                answer = s.recv(HEADER_BYTES).decode("ascii", "replace").strip()
        except OSError as e:  # reset or timed out once connected: node 0 refused or stopped waiting
            return {"sent": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        if answer == "OK":
            return {"sent": True}
        err = f"node 0 answered {answer[:200]!r}" if answer else "node 0 closed the connection"
        if "being received" not in answer:
            return {"sent": False, "error": err}
        time.sleep(RETRY_S)
