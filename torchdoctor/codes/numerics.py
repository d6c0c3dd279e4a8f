"""Numerics and training-bug codes (FINDINGS.md, "Numerics and training bugs")."""

from torchdoctor.codes import declare
from torchdoctor.skills import CHECKPOINTING, DEBUGGING, MIXED_PRECISION, MODULE_DESIGN

declare("nonfinite-forward", DEBUGGING, "error",
        "first module whose output has NaN/Inf while its inputs are finite")
declare("nonfinite-gradient", DEBUGGING, "error",
        "first parameter whose gradient is NaN/Inf while the loss is finite")
declare("nonfinite-loss", DEBUGGING, "error",
        "loss became NaN/Inf and no earlier localization was possible")
declare("gradient-explosion", DEBUGGING, "warning",
        "gradient norm grows by orders of magnitude or spikes before divergence")
declare("missing-zero-grad", DEBUGGING, "error",
        "gradients accumulate across optimizer steps without being cleared")
declare("fp16-without-scaler", MIXED_PRECISION, "warning",
        "float16 autocast backward without a GradScaler")
declare("eval-mode-training", DEBUGGING, "warning",
        "optimizer steps while modules with Dropout/BatchNorm are in eval mode")
declare("unused-parameters", MODULE_DESIGN, "warning",
        "parameters that require grad never receive a gradient")
declare("inplace-modified", DEBUGGING, "error",
        "crash 'modified by an inplace operation': the forward op and line")
declare("loss-shape-broadcast", DEBUGGING, "warning",
        "loss inputs broadcast to a different shape (e.g. [B,1] vs [B])")
declare("params-not-in-optimizer", MODULE_DESIGN, "warning",
        "trainable parameters absent from every optimizer param group")
declare("unregistered-submodule", MODULE_DESIGN, "warning",
        "an nn.Module held in a plain list/dict/tuple attribute, so its parameters are not registered")
declare("device-mismatch", MODULE_DESIGN, "error",
        "crash 'Expected all tensors to be on the same device': the tensor's origin")
declare("unseeded-run", CHECKPOINTING, "info",
        "no RNG seeding seen")
