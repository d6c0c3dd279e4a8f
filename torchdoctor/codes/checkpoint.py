"""Checkpoint codes (probe `checkpoint-audit`; skill checkpointing-and-reproducibility)."""

from torchdoctor.codes import declare
from torchdoctor.skills import CHECKPOINTING

declare("ckpt-unreadable", CHECKPOINTING, "error",
        "not a checkpoint torchdoctor can read (truncated, corrupt, wrong format): says which")
declare("ckpt-unsafe-pickle", CHECKPOINTING, "warning",
        "needs arbitrary-code unpickling (weights_only=False): lists the globals it would import; nothing is executed")
declare("ckpt-full-model-pickle", CHECKPOINTING, "warning",
        "a whole pickled nn.Module instead of a state_dict")
declare("ckpt-part-file", CHECKPOINTING, "info",
        "the file is one part of a checkpoint (only optimizer, scheduler, scaler or RNG state, or one file of "
        "an accelerate/Trainer/DeepSpeed/DCP folder): audit the folder")
declare("ckpt-missing-model", CHECKPOINTING, "error", "no model weights found")
declare("ckpt-missing-optimizer", CHECKPOINTING, "warning", "training cannot resume exactly: no optimizer state")
declare("ckpt-missing-scheduler", CHECKPOINTING, "warning",
        "no LR-scheduler state while the optimizer state suggests one is used (info when unknown)")
declare("ckpt-missing-rng", CHECKPOINTING, "warning", "no RNG state (torch CPU/CUDA, numpy, python)")
declare("ckpt-missing-progress", CHECKPOINTING, "warning", "no epoch/step counter")
declare("ckpt-missing-scaler", CHECKPOINTING, "warning",
        "float16 training signs but no GradScaler state: a few skipped steps on resume (info unless --expect resume)")
declare("ckpt-nonfinite-weights", CHECKPOINTING, "error", "NaN/Inf in saved tensors: which ones")
declare("ckpt-wrapper-prefix", CHECKPOINTING, "info",
        "keys carry `module.` (DDP) or `_orig_mod.` (torch.compile) prefixes")
declare("ckpt-optimizer-mismatch", CHECKPOINTING, "error",
        "optimizer state does not match the model's parameters (count or shapes)")
declare("ckpt-device-tensors", CHECKPOINTING, "info", "tensors saved on CUDA devices")
declare("ckpt-model-mismatch", CHECKPOINTING, "error",
        "the state_dict does not fit the model given with --model: missing/unexpected keys, shape mismatches")
