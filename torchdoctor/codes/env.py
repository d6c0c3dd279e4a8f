"""Environment codes (probe `env`; also in every report's header)."""

from torchdoctor.codes import declare
from torchdoctor.skills import MIXED_PRECISION, PERFORMANCE, TENSOR_MEMORY

declare("torch-cpu-build-on-gpu-host", PERFORMANCE, "error",
        "NVIDIA GPUs are present but the installed torch has no CUDA")
declare("gpu-memory-in-use", TENSOR_MEMORY, "warning",
        "other processes already hold a large share of a GPU's memory")
declare("tf32-disabled", MIXED_PRECISION, "info",
        "float32 matmuls run without TF32 on a GPU that supports it")
