"""Distributed codes of the script probes under torchrun (issue 8, part B: collective-hang,
collective-mismatch, missing-distributed-sampler, sampler-epoch-not-set, rank-straggler).

The codes of `torchdoctor dist` without a script (launch audit, self-test) are declared in the
rule modules that raise them: rules/dist_env.py, rules/dist_nccl_env.py, rules/dist_selftest.py.
"""

from torchdoctor.codes import declare
from torchdoctor.skills import DISTRIBUTED

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
