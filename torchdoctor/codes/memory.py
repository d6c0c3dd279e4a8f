"""Memory codes (FINDINGS.md, "Memory"; skill tensor-operations-and-memory)."""

from torchdoctor.codes import declare
from torchdoctor.skills import TENSOR_MEMORY

declare("memory-growth", TENSOR_MEMORY, "error",
        "allocated memory (CUDA) or live tensor bytes (CPU) grows step over step")
declare("out-of-memory", TENSOR_MEMORY, "error",
        "the run hit out-of-memory: bytes requested, capacity, what was live")
declare("memory-fragmentation", TENSOR_MEMORY, "warning",
        "reserved - allocated is large at peak")
declare("grad-in-eval", TENSOR_MEMORY, "warning",
        "forward passes build autograd graphs that are never backpropagated")
declare("activation-dominated", TENSOR_MEMORY, "info",
        "activations dominate peak memory")
