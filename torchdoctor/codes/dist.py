"""Distributed codes: the environment audit and self-test of `torchdoctor dist` (issue 8,
part A). The script probes' codes under torchrun (part B) are declared in the rules that raise
them: rules/ranks_collectives.py, rules/ranks_samplers.py, rules/ranks_stragglers.py.
"""

from torchdoctor.codes import declare
from torchdoctor.skills import DISTRIBUTED

declare("dist-env-inconsistent", DISTRIBUTED, "error",
        "RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT missing or contradictory")
declare("nccl-unavailable", DISTRIBUTED, "error",
        "CUDA present but NCCL backend unusable")
declare("nccl-env-risky", DISTRIBUTED, "warning",
        "NCCL variables that cripple or hide (e.g. NCCL_P2P_DISABLE=1, deprecated names)")
declare("allreduce-bandwidth-low", DISTRIBUTED, "warning",
        "measured all-reduce bus bandwidth far under what the links allow")
declare("collective-selftest-failed", DISTRIBUTED, "error",
        "the collective self-test returned wrong values, crashed or did not finish in time")

