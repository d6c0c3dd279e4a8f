"""Performance codes (docs/findings/README.md)."""

from torchdoctor.codes import declare
from torchdoctor.skills import MIXED_PRECISION, PERFORMANCE

declare("dataloader-bound", PERFORMANCE, "error",
        "the loop waits on the next batch for >= 30% of step time")
declare("host-sync-in-loop", PERFORMANCE, "warning",
        "device-to-host syncs every step stall the GPU")
declare("launch-bound", PERFORMANCE, "warning",
        "GPU busy < 50% of step time while data wait is low: many small kernels")
declare("pageable-h2d-copy", PERFORMANCE, "warning",
        "host-to-device copies come from pageable memory")
declare("fp32-compute-bound", MIXED_PRECISION, "warning",
        "matmul/conv dominate GPU time in float32 on a GPU with bf16 tensor cores")
declare("model-moved-in-loop", PERFORMANCE, "warning",
        "a module is moved with .to()/.cuda() every step")
declare("slow-python-loop", PERFORMANCE, "info",
        "Python-side CPU time dominates the step (no GPU)")
declare("cpu-oversubscribed", PERFORMANCE, "warning",
        "intra-op threads x processes exceed the CPU cores available, or the host is loaded")
