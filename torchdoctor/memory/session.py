"""Per-process state shared by the memory instruments of one run (they run in one child).

The detail instrument (memory probe) registers what it armed; the sampler (memory and
checkup) reads it to add activations to its samples and to build the OOM context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MemorySession:
    saved: Any = None  # SavedTensors, when armed
    history: bool = False  # CUDA memory history recording is on
    history_mode: str = ""
    oom: dict[str, Any] | None = None  # what the OOM observer saw
    snapshot_dir: Any = None  # where an OOM snapshot may be written (Path)
    param_keys: list[tuple[int, bool]] = field(default_factory=list)  # storages of parameters
    n_models: int = -1  # len(ctx.models()) when param_keys was computed
    heap: Any = None  # HeapCounter, created once
    base_heap: int | None = None  # heap bytes before the script ran
    base_rss: int | None = None

    def heap_counter(self) -> Any:
        """The process's heap counter; the first call also records the pre-script baseline."""
        if self.heap is None:
            from torchdoctor.memory.host import HeapCounter, rss_bytes

            self.heap = HeapCounter()
            self.base_heap = self.heap.read()
            self.base_rss = rss_bytes()
        return self.heap

    def refresh_param_keys(self, models: list[Any]) -> list[tuple[int, bool]]:
        """Parameter storage keys, recomputed when the set of root models changed."""
        if len(models) != self.n_models:
            from torchdoctor.memory.tensors import param_keys

            self.param_keys = param_keys(models)
            self.n_models = len(models)
        return self.param_keys


SESSION = MemorySession()


def reset() -> MemorySession:
    global SESSION
    SESSION = MemorySession()
    return SESSION


def current() -> MemorySession:
    return SESSION
