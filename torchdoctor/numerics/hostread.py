"""Reading small device rows on the host without stalling the GPU.

A ``.tolist()`` of a CUDA tensor is a synchronisation: the host waits for *every* kernel queued
before it, so once per step it takes away the host's run-ahead over the GPU. On an H100
transformer step (bench/nan_overhead.py) that alone made the ``nan`` probe 1.8x the bare step.
:class:`CudaRowReader` instead copies each row into pinned host memory with
``non_blocking=True`` and records a CUDA event behind the copy; the row is read once
``Event.query()`` says the copy is done (a poll, no sync), typically one step later.
"""

from __future__ import annotations

from typing import Any

SLOT = 8  # floats per row (rows hold at most 4 values)
SLOTS = 1024  # rows in flight before a slot is reused


class CudaRowReader:
    """Ring of pinned host slots; ``submit(row) -> handle``, ``ready(handle)``, ``values``."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        # explicit device: the script may have set torch.set_default_device("cuda")
        self.buf = torch.empty(SLOT * SLOTS, dtype=torch.float64, device="cpu",
                               pin_memory=True)  # float64: a float64 loss keeps its range
        self.pos = 0

    def submit(self, row: Any) -> tuple[Any, Any]:
        torch = self.torch
        n = row.numel()
        if n > SLOT:
            raise ValueError(f"row of {n} values > {SLOT}")
        i = self.pos
        self.pos = (self.pos + 1) % SLOTS
        dst = self.buf[i * SLOT: i * SLOT + n]
        with torch.cuda.device(row.device):
            stream = torch.cuda.current_stream(row.device)
            dst.copy_(row.detach().reshape(-1).double(), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        return dst, ev

    @staticmethod
    def ready(handle: tuple[Any, Any]) -> bool:
        return bool(handle[1].query())

    @staticmethod
    def values(handle: tuple[Any, Any]) -> list[float]:
        handle[1].synchronize()  # a no-op when ready() said so
        return handle[0].tolist()


class DeferredRowReader:
    """The CUDA reader's timing on CPU tensors, for tests: a row becomes readable only once a
    later row was submitted (as a copy landing one step late). Option ``nan_async_test``."""

    def __init__(self) -> None:
        self.n = 0

    def submit(self, row: Any) -> list:
        self.n += 1
        return [row.detach().clone(), self.n, self]

    @staticmethod
    def ready(handle: list) -> bool:
        return handle[1] < handle[2].n

    @staticmethod
    def values(handle: list) -> list[float]:
        return handle[0].tolist()
