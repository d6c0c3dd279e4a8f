"""The eight skills (the `skill` field of a finding or route), as in docs/contract.md."""

TENSOR_MEMORY = "tensor-operations-and-memory"
MODULE_DESIGN = "module-design-patterns"
DISTRIBUTED = "distributed-training-strategies"
MIXED_PRECISION = "mixed-precision-and-optimization"
PERFORMANCE = "performance-profiling"
DEBUGGING = "debugging-techniques"
CHECKPOINTING = "checkpointing-and-reproducibility"
CUSTOM_AUTOGRAD = "custom-autograd-functions"

ALL_SKILLS = (
    TENSOR_MEMORY,
    MODULE_DESIGN,
    DISTRIBUTED,
    MIXED_PRECISION,
    PERFORMANCE,
    DEBUGGING,
    CHECKPOINTING,
    CUSTOM_AUTOGRAD,
)
