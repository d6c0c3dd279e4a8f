"""Every treatment ``treat`` can try, declared once: what it changes, when it applies, its loss
tolerance and why (docs/treat.md prints the same table). Pure data: no torch.

``device``: ``"cuda"`` — applies on CUDA only, skipped on CPU even when forced (``tf32`` on CPU:
"no CUDA"); ``"auto-cuda"`` — chosen by itself only on CUDA, but ``--try`` runs it on CPU too
(it has a CPU meaning: fused CPU Adam, CPU bf16 autocast, …); ``"any"``.

``scope``: ``"ranked"`` — a trial of ``treat --nproc-per-node N`` only (DDP's buckets, FSDP2's
mixed precision and per-block compile), never in a one-process plan; ``"both"``: one process and
ranks alike — except where :data:`RANKED_INVALID` says that, on ranks wrapped in DDP or FSDP2, the
one-process trial is not a valid measurement of the fix (then it is listed as skipped, with why).

``intent``: ``"speed"`` (adopted when faster beyond the noise band) or ``"memory"`` (adopted
when it saves memory as intended, or avoids the baseline's out-of-memory crash).

``tolerance``: the largest relative per-step loss difference from the baseline that still
counts as "the loss kept" (see :mod:`torchdoctor.treat.verdict`):

* ``EXACT`` (1e-5) — the treatment does not change any arithmetic (same batches, same kernels):
  the loss must match to float32 print precision;
* ``REORDER`` (1e-3) — same precision, other kernels or another summation order (fused
  optimizer kernels, channels-last convolutions, cuDNN's autotuned algorithms, compiled and
  fused kernels): float32 rounding differs per op (~1e-7 relative) and training amplifies it
  over the steps; a thousandth is far above that over tens of steps and far below a real change;
* ``TF32`` (2e-2) — matmul inputs rounded to a 10-bit mantissa (2^-11 ≈ 4.9e-4 relative per
  rounding) through every layer and step;
* ``BF16`` (5e-2) — forward activations and matmuls in bf16 (8-bit mantissa, 2^-8 ≈ 3.9e-3
  relative per rounding), compounded over layers and steps: a few percent on the loss early in
  training is rounding; beyond 5 % something lost more than precision (a reduction or
  normalisation that overflows or underflows in bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

EXACT = 1e-5
REORDER = 1e-3
DDP_DEFAULT_MB = 25.0  # torch's DistributedDataParallel bucket_cap_mb when a script passes none
BUCKET_FACTOR = 4.0  # ddp-bucket-cap without a value: this many times the script's bucket size
TF32 = 2e-2
BF16 = 5e-2


@dataclass(frozen=True)
class Treatment:
    name: str
    family: str  # the child module in torchdoctor/treat/ that applies it
    changes: str  # what it changes, for people (--list, docs)
    applies: str  # when it is chosen by itself (--list, docs)
    device: str = "any"  # "cuda" | "auto-cuda" | "any"
    intent: str = "speed"  # "speed" | "memory"
    tolerance: float = REORDER
    value: str = ""  # what --try NAME=VALUE sets ("" : takes no value)
    group: str = ""  # treatments of one group are not combined: the fastest adopted one is kept
    confirms: tuple[str, ...] = ()  # finding codes an adopted trial of it confirms (measured ratio)
    # words that mark this treatment's advice inside another finding's fix text (``; ``-joined
    # parts): a trial measured slower or within noise withdraws those parts (treat/confirm.py)
    fix_words: tuple[str, ...] = ()
    scope: str = "both"  # "both" | "ranked" (see the module docstring)


CATALOGUE: tuple[Treatment, ...] = (
    Treatment("dataloader-workers", "data",
              "DataLoader(num_workers=N from the CPU cores (2..8), persistent_workers=True, "
              "prefetch_factor=2) for every map-style DataLoader built with fewer workers",
              "dataloader-bound: the loop waits for batches", tolerance=EXACT,
              value="N: the number of workers", confirms=("dataloader-bound",),
              fix_words=("num_workers=", "persistent_workers=True")),
    Treatment("pin-memory", "data",
              "DataLoader(pin_memory=True), and .to(cuda)/.cuda() of a pinned CPU tensor made "
              "non_blocking=True (unless the call says non_blocking=False)",
              "CUDA, a DataLoader without pin_memory, or pageable-h2d-copy", device="cuda",
              tolerance=EXACT, confirms=("pageable-h2d-copy",), fix_words=("pin_memory=True",)),
    Treatment("tf32", "precision",
              "torch.set_float32_matmul_precision('high') and torch.backends.cudnn.allow_tf32 = True "
              "(TF32 tensor cores for float32 matmuls and convolutions)",
              "CUDA, float32 parameters, TF32 not already allowed", device="cuda",
              tolerance=TF32, group="precision", confirms=("tf32-disabled", "fp32-compute-bound"),
              fix_words=("tf32", "set_float32_matmul_precision")),
    Treatment("bf16-autocast", "precision",
              "the forward pass and the loss under torch.autocast(device, dtype=torch.bfloat16); "
              "backward and the optimizer step outside it",
              "CUDA with bf16 support, float32 parameters, no autocast in the script",
              device="auto-cuda", tolerance=BF16, group="precision",
              confirms=("fp32-compute-bound",), fix_words=("bfloat16", "bf16 autocast")),
    Treatment("channels-last", "model",
              "the outermost models .to(memory_format=torch.channels_last) and their 4-D "
              "inputs .contiguous(memory_format=torch.channels_last)",
              "CUDA, a model with Conv2d layers", device="auto-cuda", fix_words=("channels_last",)),
    Treatment("fused-optimizer", "optim",
              "Adam/AdamW/SGD built with fused=True (one kernel for the whole update)",
              "CUDA, an Adam/AdamW/SGD optimizer without fused=True", device="auto-cuda",
              fix_words=("fused=True",)),
    Treatment("cudnn-benchmark", "backend",
              "torch.backends.cudnn.benchmark = True (autotuned convolution algorithms)",
              "CUDA, a model with Conv2d layers, the same input shapes every step", device="cuda",
              fix_words=("cudnn.benchmark",)),
    Treatment("expandable-segments", "backend",
              "environment PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the run",
              "CUDA, memory-fragmentation or out-of-memory", device="cuda", intent="memory",
              tolerance=EXACT, confirms=("memory-fragmentation", "out-of-memory"),
              fix_words=("expandable_segments",)),
    Treatment("compile", "model",
              "nn.Module.compile() of the outermost models, in place (state_dict keys "
              "unchanged); the steps until compilation settles are left out of the step time",
              "CUDA, the step not data-bound, the model not compiled already", device="auto-cuda",
              confirms=("launch-bound", "slow-python-loop"),
              value="MODE: default, reduce-overhead, max-autotune, or a backend (eager, "
                    "aot_eager, inductor)"),
    Treatment("set-to-none", "optim",
              "zero_grad(set_to_none=True) where the script calls zero_grad(set_to_none=False)",
              "a zero_grad(set_to_none=False) call", tolerance=EXACT),
    # ---- under data parallelism (``treat --nproc-per-node N``): docs/treat.md "On N ranks" ----
    Treatment("ddp-bucket-cap", "dist",
              "DistributedDataParallel(bucket_cap_mb=MB): larger gradient buckets (default 4x the "
              "script's, 25 MiB when unset): fewer all-reduces, each nearer bus bandwidth",
              "DDP whose parameters fill more than one bucket of its bucket_cap_mb",
              tolerance=REORDER, value="MB: the bucket size in MiB", scope="ranked",
              fix_words=("bucket_cap_mb",)),
    Treatment("fsdp-bf16", "dist",
              "fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
              "reduce_dtype=torch.float32)) for every fully_shard call without a param_dtype: "
              "bf16 all-gathers and compute, float32 gradient reduction",
              "FSDP2 with float32 parameters and no param_dtype, CUDA with bf16 support",
              device="auto-cuda", tolerance=BF16, group="precision", scope="ranked",
              fix_words=("MixedPrecisionPolicy",)),
    Treatment("compile-blocks", "dist",
              "block.compile() of every fully_shard unit below the root (each FSDP2 block "
              "compiled in place, the root's all-gather hooks left to FSDP2); the steps until "
              "compilation settles are left out of the step time",
              "CUDA, FSDP2 with blocks sharded apart from the root, not compiled already",
              device="auto-cuda", scope="ranked",
              value="MODE: default, reduce-overhead, max-autotune, or a backend (eager, "
                    "aot_eager, inductor)"),
)

BY_NAME: dict[str, Treatment] = {t.name: t for t in CATALOGUE}
FAMILIES = ("data", "precision", "model", "optim", "backend", "dist")

# why a one-process trial is left out of the ranked plan, by what the ranks were wrapped in
# ("fsdp2", "ddp"); a wrapping not named here keeps the trial
RANKED_INVALID: dict[str, dict[str, str]] = {
    "bf16-autocast": {
        "fsdp2": "under FSDP2 autocast around the sharded model keeps float32 all-gathers and "
                 "reduce-scatters; bf16 compute there is fully_shard's MixedPrecisionPolicy "
                 "(fsdp-bf16)"},
    "compile": {
        "fsdp2": "whole-model compile of an FSDP2 model traces across its units' all-gather hooks; "
                 "FSDP2 compiles per block (compile-blocks)"},
    "channels-last": {
        "fsdp2": "converting sharded DTensor parameters at the first forward changes their layout "
                 "under FSDP2's all-gather buffers: convert before fully_shard",
        "ddp": "converting the parameters at the first forward comes after DDP built its gradient "
               "buckets from their old strides (a slower gradient copy, not the fix): convert "
               "before wrapping in DDP"},
}


def lookup(name: str) -> Treatment | None:
    return BY_NAME.get(name)


def parse_try(spec: str) -> tuple[str, str | None]:
    """``"NAME"`` or ``"NAME=VALUE"`` → (name, value); ValueError for an unknown name or a
    value given to a treatment that takes none."""
    name, sep, value = spec.partition("=")
    name = name.strip()
    t = BY_NAME.get(name)
    if t is None:
        from difflib import get_close_matches

        near = get_close_matches(name, list(BY_NAME), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"unknown treatment {name!r}{hint}; `torchdoctor treat --list` lists them")
    if sep and not t.value:
        raise ValueError(f"{name} takes no value (got {spec!r})")
    if sep and not value.strip():
        raise ValueError(f"{name}=: a value is missing ({t.value})")
    if sep and name == "ddp-bucket-cap":
        try:
            ok = 0 < float(value) <= 4096
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"ddp-bucket-cap=MB needs a bucket size in MiB (0 < MB <= 4096), not {value!r}")
    if sep and name == "dataloader-workers":
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"dataloader-workers=N needs a number of workers >= 1, not {value!r}")
    return name, (value.strip() if sep else None)
