"""Distributed codes: the environment audit and self-test of `torchdoctor dist` (issue 8,
part A), and the script probes under torchrun (part B: collective-hang, collective-mismatch,
missing-distributed-sampler, sampler-epoch-not-set, rank-straggler).
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

# Script probes under torchrun (issue 8, part B: torchdoctor/distributed/ranked.py, rules/dist_script.py)
declare("collective-hang", DISTRIBUTED, "error",
        "ranks stuck: which rank waits in which collective, and which rank skipped it")
declare("collective-mismatch", DISTRIBUTED, "error",
        "ranks called different collectives or shapes")
declare("missing-distributed-sampler", DISTRIBUTED, "error",
        "every rank reads the same samples")
declare("sampler-epoch-not-set", DISTRIBUTED, "warning",
        "DistributedSampler.set_epoch not called between epochs")
declare("rank-straggler", DISTRIBUTED, "warning",
        "one rank's step time is consistently slower")
