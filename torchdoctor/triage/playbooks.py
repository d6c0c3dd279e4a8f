"""Per skill: the probe to run next and the steps an expert takes, in order, measuring first.

Each step names what performs it: a torchdoctor probe (``torchdoctor memory SCRIPT``) or
``by hand`` (a change to make, or a torch tool to call yourself). The steps cover what the
baseline answers missed: the memory workflow and its fixes in order, DDP launch and
init, sampler/seeds/eval pitfalls and bucket sizes, profiling before guessing, locating the first
non-finite value, and complete checkpoints with RNG state and determinism flags.
``SCRIPT`` and ``PATH`` are placeholders for the user's training script and checkpoint file.

``VARIANTS``: a skill's playbook for one particular question, chosen by the signal that routed
(``symptoms.Signal.variant``): reproducibility -> ``repro``, torch.compile -> ``compile``. ``after``:
the command offered once the probe has measured (``treat``, which applies the fixes in the child
and measures them before/after), shown by ``ask --run`` under the probe's report.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchdoctor.triage.symptoms import AG, CKPT, DBG, DIST, MEM, MOD, MP, PERF

BY_HAND = "by hand"


@dataclass(frozen=True)
class Step:
    text: str
    by: str  # the torchdoctor probe that performs it, or BY_HAND

    def render(self) -> str:
        return f"{self.text} [{self.by}]"


@dataclass(frozen=True)
class Playbook:
    skill: str
    probe: str  # the command to run next
    summary: str  # what this skill is about, one line
    steps: tuple[Step, ...]
    after: str | None = None  # the command to offer once the probe has measured (e.g. treat)


def _pb(skill: str, probe: str, summary: str, *steps: tuple[str, str], after: str | None = None) -> Playbook:
    return Playbook(skill, probe, summary, tuple(Step(t, by) for t, by in steps), after)


PROBE_MEM = "torchdoctor memory SCRIPT"
PROBE_PERF = "torchdoctor profile SCRIPT"
PROBE_NAN = "torchdoctor nan SCRIPT"
PROBE_DIST = "torchdoctor dist [SCRIPT]"
PROBE_CKPT = "torchdoctor checkpoint-audit PATH"
PROBE_CHECKUP = "torchdoctor checkup SCRIPT"
PROBE_TREAT = "torchdoctor treat SCRIPT"
PROBE_REPRO = "torchdoctor repro SCRIPT"
PROBE_COMPILE = "torchdoctor compile SCRIPT"
PROBE_GRADCHECK = "torchdoctor gradcheck SCRIPT"
PROBE_ATTACH = "torchdoctor attach --job [PID]"

PLAYBOOKS: dict[str, Playbook] = {p.skill: p for p in (
    _pb(MEM, PROBE_MEM, "tensor lifetimes, memory budget, OOM and leaks",
        ("Measure before changing anything: memory timeline per step, peak broken down into parameters / "
         "gradients / optimizer state / activations, growth per step, and on OOM the bytes requested vs "
         "capacity, allocated and reserved", PROBE_MEM),
        ("If memory grows step over step, find what keeps tensors alive across steps: `total += loss` "
         "instead of `loss.item()`, outputs or losses appended to a list, evaluation without "
         "`torch.no_grad()` (findings memory-growth, grad-in-eval name the sites)", PROBE_MEM),
        ("If it fails at the first step, do the budget: model size and input dimensions decide it; fp32 "
         "Adam needs 16 bytes per parameter (weights, gradients, two moments) before activations, which "
         "grow with batch x sequence length / image size", PROBE_MEM),
        ("Fix the biggest term first: activations -> mixed precision (bf16/fp16 autocast), then activation "
         "checkpointing (`torch.utils.checkpoint`) on the largest blocks, then a smaller micro-batch with "
         "gradient accumulation to keep the effective batch; optimizer state -> a sharded optimizer or "
         "FSDP", BY_HAND),
        ("If reserved is much larger than allocated (fragmentation), set "
         "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; `torch.cuda.empty_cache()` does not make "
         "more memory available to PyTorch", BY_HAND),
        ("Verify: run the memory probe again and compare the peak and the per-step growth", PROBE_MEM),
        ),
    _pb(MOD, PROBE_CHECKUP, "nn.Module structure, registration, initialization",
        ("Measure: one bounded run that checks submodules held in plain lists/dicts (unregistered), "
         "parameters missing from the optimizer, parameters that never get a gradient, device mismatches, "
         "training in eval mode", PROBE_CHECKUP),
        ("Structure: create submodules in `__init__` as attributes, `nn.ModuleList`/`nn.ModuleDict` for "
         "collections, `nn.Parameter` for learnables, `register_buffer` for state that must move with "
         "`.to()` and be saved but not trained; no tensors created on a fixed device inside `forward`",
         BY_HAND),
        ("Initialization: override `reset_parameters()` or apply `nn.init` functions with "
         "`model.apply(init_fn)`; check the defaults before replacing them", BY_HAND),
        ("A slow custom layer: vectorise (no Python loops over the batch or elements, no `.item()` in "
         "`forward`), use fused built-ins (`F.scaled_dot_product_attention`, `nn.functional` ops), then "
         "profile it", PROBE_PERF),
        ("Needs a gradient autograd cannot derive? Write a `torch.autograd.Function` (custom autograd "
         "route)", BY_HAND),
        ("Verify: run the checkup again; the model's `state_dict()` keys should be what you expect",
         PROBE_CHECKUP),
        ),
    _pb(DIST, PROBE_DIST, "DDP/FSDP setup, launch, synchronisation, hangs",
        ("Measure the environment first: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, "
         "backend (NCCL for GPUs, gloo for CPU), GPU visibility per rank, a collective's bandwidth",
         PROBE_DIST),
        ("Launch with `torchrun --nproc-per-node=N train.py` (`python -m torch.distributed.launch` is "
         "deprecated); multi-node: `--nnodes`, `--node-rank` or `--rdzv-backend=c10d "
         "--rdzv-endpoint=HOST:PORT` on every node", BY_HAND),
        ("Init: `torch.cuda.set_device(local_rank)` first, then `dist.init_process_group(\"nccl\")` "
         "with the default `init_method=\"env://\"` (torchrun sets the variables); `tcp://host:port` or "
         "`file:///shared/path` only without torchrun; pass `timeout=` to bound hangs", BY_HAND),
        ("Wrap: `DDP(model.to(local_rank), device_ids=[local_rank])`; `SyncBatchNorm` when the per-GPU "
         "batch is small; `find_unused_parameters=True` only if some parameters get no gradient (it costs "
         "a graph walk per step; the checkup reports unused parameters), `static_graph=True` when the "
         "graph never changes", PROBE_CHECKUP),
        ("Data and seeds: `DistributedSampler(dataset, shuffle=True)` with `sampler.set_epoch(epoch)` "
         "every epoch (else every epoch repeats the same order) and no `shuffle=True` on the DataLoader; "
         "the same model seed on every rank, data-augmentation seeds offset by rank", BY_HAND),
        ("Gradient synchronisation: DDP all-reduces gradients in buckets during backward "
         "(`bucket_cap_mb`, default 25 MiB; larger buckets for big models on fast links); wrap "
         "gradient-accumulation micro-steps in `model.no_sync()`; scale the learning rate with the "
         "global batch", BY_HAND),
        ("Pitfalls: every rank must call every collective in the same order (logging, eval or early exit on "
         "rank 0 only must not skip one); `model.eval()` on all ranks and `all_reduce` the metrics; save "
         "from rank 0 only and `dist.barrier()` before others load", BY_HAND),
        ("A hang or mismatch: re-run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` and `NCCL_DEBUG=INFO` under "
         "the probe, which launches through torchrun and reports where each rank was stuck",
         "torchdoctor dist --nproc-per-node N SCRIPT"),
        ),
    _pb(PERF, PROBE_PERF, "where the step time goes, before any optimisation",
        ("Measure first: split each step into data wait / forward / backward / optimizer, then a short "
         "torch.profiler window for the top ops and a trace (Perfetto); note GPU model, batch size, "
         "num_workers, AMP on/off", PROBE_PERF),
        ("Data-bound (the loop waits on the next batch): `num_workers` up to the cores you have, "
         "`pin_memory=True`, `persistent_workers=True`, cheaper decoding/augmentation - before touching "
         "the model", PROBE_PERF),
        ("GPU stalls: device-to-host syncs every step (`.item()`, `.cpu()`, printing CUDA tensors), many "
         "tiny kernels (launch-bound: bigger batch, `torch.compile`, CUDA graphs), pageable host-to-device "
         "copies (`pin_memory` + `non_blocking=True`), CPU threads oversubscribed", PROBE_PERF),
        ("Compute-bound in float32 on a GPU with tensor cores: then the mixed-precision route (bf16 "
         "autocast, TF32); memory-bound: the memory route; one GPU saturated: the distributed route",
         BY_HAND),
        ("Time correctly when you measure yourself: CUDA is asynchronous, so synchronise (or use CUDA "
         "events) before reading a clock; warm up before timing", BY_HAND),
        ("Verify the cure on your script before editing it: each fix that applies (DataLoader workers, "
         "pinned memory, TF32, bf16 autocast, channels-last, fused optimizer, torch.compile, ...) is applied "
         "in the child and measured against the unchanged run: speed-up beyond the noise, memory, loss kept, "
         "and the line to change", PROBE_TREAT),
        after=PROBE_TREAT),
    _pb(MP, PROBE_PERF, "AMP, fp16/bf16, gradient scaling, TF32",
        ("Measure first. Speed: is the step compute-bound in float32 at all? If it waits on data, syncs "
         "or kernel launches, mixed precision will not help. Numerics: where the first non-finite value "
         "appears with AMP on", f"{PROBE_PERF}, then {PROBE_NAN}"),
        ("Pick the dtype: bf16 on Ampere or newer (A100/H100: no GradScaler needed); fp16 on V100/T4 "
         "with `torch.amp.GradScaler(\"cuda\")`; TF32 for the remaining fp32 matmuls "
         "(`torch.set_float32_matmul_precision(\"high\")`)", BY_HAND),
        ("Autocast the forward pass and the loss only: `with torch.autocast(\"cuda\", "
         "dtype=torch.bfloat16):`; call backward outside it; do not `.half()` the model", BY_HAND),
        ("fp16 scaler order: `scaler.scale(loss).backward()`, `scaler.unscale_(opt)` before gradient "
         "clipping, `scaler.step(opt)`, `scaler.update()`; save `scaler.state_dict()` in checkpoints",
         BY_HAND),
        ("Ops unsafe in fp16: `BCELoss` -> `BCEWithLogitsLoss`; custom Functions need "
         "`torch.amp.custom_fwd`/`custom_bwd`", BY_HAND),
        ("Measure the gain and check the numerics on your script: bf16 autocast and TF32 applied in the child, "
         "step time and the loss curve compared with the unchanged run", PROBE_TREAT),
        ("Verify numerics over a longer run: watch for the first non-finite value with AMP on, compare the "
         "loss curve with fp32 over a few hundred steps", PROBE_NAN),
        after=PROBE_TREAT),
    _pb(DBG, PROBE_NAN, "NaN/Inf, divergence and training bugs, located systematically",
        ("Locate before fixing: for a crash, the decisive error line and the frame of your code; for "
         "NaN/Inf or divergence, watch every module output and gradient: the probe names the first module "
         "(path, class, op) and step whose output becomes NaN/Inf while its inputs are finite, or the "
         "first non-finite gradient", PROBE_NAN),
        ("Check the gradient norm per step: a climb of orders of magnitude before the NaN means divergence "
         "(learning rate, warmup, clipping), a sudden NaN at one op means a numerical hazard", PROBE_NAN),
        ("Check the data: NaN/Inf in inputs or labels, labels outside the class range, a batch that is "
         "all padding", BY_HAND),
        ("Look at the op it names: log/sqrt/division of 0 or negatives, `exp` overflow, softmax over an "
         "all-masked row, fp16 overflow above 65504; use eps, clamping, `log_softmax`/`logsumexp`, "
         "`BCEWithLogitsLoss`", BY_HAND),
        ("Replay only the failing window with `torch.autograd.set_detect_anomaly(True)` (about 2.5x "
         "slower) to get the backward node and the forward line", BY_HAND),
        ("Then fix the cause: missing `optimizer.zero_grad()`, lower learning rate or warmup, "
         "`clip_grad_norm_`; with AMP, the mixed-precision route", PROBE_CHECKUP),
        ),
    _pb(CKPT, PROBE_CKPT, "complete checkpoints, exact resume, reproducibility",
        ("Audit what a checkpoint holds and lacks (model, optimizer, scheduler, GradScaler, RNG states, "
         "epoch/step), loaded safely without running pickled code", PROBE_CKPT),
        ("Save one dict: `model.state_dict()` (unwrapped from DDP `.module` / `torch.compile` "
         "`_orig_mod`), `optimizer.state_dict()`, `scheduler.state_dict()`, `scaler.state_dict()`, epoch and "
         "global step, and RNG states: `torch.get_rng_state()`, `torch.cuda.get_rng_state_all()`, "
         "`numpy.random.get_state()`, `random.getstate()`", BY_HAND),
        ("Write atomically (save to a temporary file, then `os.replace`), keep the last few, save from "
         "rank 0 only under DDP", BY_HAND),
        ("Resume: build model and optimizer as before, `load_state_dict` each, restore the RNG states, "
         "continue from the saved step + 1 (and the sampler's epoch); `map_location` for another device",
         BY_HAND),
        ("Reproducibility: seed `torch.manual_seed`, `numpy.random.seed`, `random.seed`; seed DataLoader "
         "workers (`generator=`, `worker_init_fn`); `torch.use_deterministic_algorithms(True)`, "
         "`torch.backends.cudnn.benchmark = False`, `CUBLAS_WORKSPACE_CONFIG=:4096:8` for CUDA "
         "determinism (slower: only when you need bit-exact runs)", BY_HAND),
        ("Verify exact resume: restore the state saved at a step, replay the next steps and compare them "
         "with the uninterrupted run; names the state whose absence makes them differ",
         "torchdoctor repro --resume-check SCRIPT"),
        ),
    _pb(AG, PROBE_GRADCHECK, "torch.autograd.Function: custom forward/backward, verified",
        ("Check every custom Function on the inputs it really gets: a bounded run captures real calls and "
         "compares each backward with finite differences in float64 (a wrong gradient names the input, the "
         "worst element and the backward's line), and reports wrong returned gradients, inputs modified in "
         "place without `ctx.mark_dirty` and tensors kept on `ctx`", PROBE_GRADCHECK),
        ("Write `class F(torch.autograd.Function)` with `@staticmethod forward(ctx, ...)` and "
         "`backward(ctx, *grad_outputs)`; `ctx.save_for_backward(...)` for tensors, plain attributes for "
         "the rest; return one gradient per forward input (None where not differentiable); call `F.apply`",
         BY_HAND),
        ("Use `ctx.needs_input_grad` to skip unneeded work, `ctx.mark_non_differentiable` for integer "
         "outputs, `ctx.mark_dirty` if forward modifies an input in place", BY_HAND),
        ("A straight-through or surrogate gradient is not a bug: gradcheck's numerical Jacobian of a "
         "piecewise-constant forward is zero; such Functions are noted, not flagged", PROBE_GRADCHECK),
        ("Verify one Function without the training script: `torchdoctor gradcheck ops.py:F --shape 4,8` "
         "(random float64 inputs of those shapes; `gradgradcheck` too when backward is differentiable)",
         PROBE_GRADCHECK),
        ("Measure the rest of the model as it is: parameters that never get a gradient, non-finite "
         "gradients and in-place modification errors with the forward line", PROBE_CHECKUP),
        ("Under AMP decorate with `torch.amp.custom_fwd(device_type=\"cuda\")` / `custom_bwd`; prefer "
         "composing existing ops (autograd derives the backward) unless memory or speed needs more, then "
         "profile", PROBE_PERF),
        ("The rest of the model: a bounded run reports parameters that never get a gradient, non-finite "
         "gradients and in-place modification errors with the forward line", PROBE_CHECKUP),
        ),
)}


# Variants of a skill's playbook, chosen by the signal that routed (``symptoms.Signal.variant``):
# the same skill, a probe that measures that particular question.
VARIANTS: dict[str, Playbook] = {
    "repro": _pb(CKPT, PROBE_REPRO, "same script, same seed, different runs: measured, not guessed",
        ("Measure: run the script twice in fresh processes (same argv and environment, bounded), compare "
         "losses, parameters and gradients step by step; the first divergent step and what diverged first, "
         "then the cause: which random generator was not seeded (Python, NumPy, torch, CUDA, DataLoader "
         "workers) and where it was drawn, or which op is nondeterministic", PROBE_REPRO),
        ("Seed every generator the script draws from: `torch.manual_seed`, `numpy.random.seed` (or a "
         "`numpy.random.default_rng(seed)` passed around), `random.seed`; DataLoader `generator=` and "
         "`worker_init_fn`", BY_HAND),
        ("A nondeterministic op (CUDA atomics in `index_add_`, `scatter_add_`, cuDNN autotuning): "
         "`torch.use_deterministic_algorithms(True)` with `CUBLAS_WORKSPACE_CONFIG=:4096:8` and "
         "`torch.backends.cudnn.benchmark = False`, at the step-time cost the probe measures", BY_HAND),
        ("Exact resume: restore the state saved at a step, replay the next steps and compare with the "
         "uninterrupted run; names the state whose absence makes them differ (optimizer, scheduler, "
         "GradScaler, RNG, data position)", "torchdoctor repro --resume-check SCRIPT"),
        ("Audit a checkpoint file for what it holds and lacks", PROBE_CKPT),
        ),
    "attach": _pb(DIST, PROBE_ATTACH, "a running job that hangs or slowed down: diagnosed without restarting it",
        ("Measure the job as it runs, without restarting it: where every rank and thread is (stacks sampled "
         "a few times), stuck or still moving, the rank the others wait for, ranks in different collectives, "
         "a stuck DataLoader worker, memory and GPU use; `torchdoctor attach PID` for one process",
         PROBE_ATTACH),
        ("A rank the others wait for: read its line (a rank-dependent branch, an uneven last batch, I/O); "
         "every rank must call the same collectives in the same order", BY_HAND),
        ("For the next run: start it with `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` and "
         "`TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/torchdoctor_fr_` (attach then reads the last collectives "
         "of every rank) and pass `timeout=` to `init_process_group`", BY_HAND),
        ("Reproduce it under the probe, which launches through torchrun and reports where each rank was "
         "stuck", "torchdoctor dist --nproc-per-node N SCRIPT"),
        ),
    "compile": _pb(PERF, PROBE_COMPILE, "torch.compile: graph breaks, recompiles, eager fallbacks, its real gain",
        ("Measure what dynamo does with your script, without editing it: graph breaks by your file:line "
         "and reason, recompiles and the guard that failed, a recompile limit that sent a function back to "
         "eager, compile time apart from the steady-state step, and the speed-up over an eager run",
         PROBE_COMPILE),
        ("Graph break in a loop or on `.item()`/`print`/data-dependent Python control flow: keep tensors "
         "on the device, move the Python decision out of `forward`, or compile a smaller region", BY_HAND),
        ("Recompiles on every step: a Python attribute or shape that changes; pass it as a tensor, "
         "dynamo's `mark_dynamic` on that dimension, or `torch.compile(dynamic=True)`", BY_HAND),
        ("Compile time is paid per new shape: fixed shapes (pad the last batch), warm-up excluded from "
         "timing; judge the gain on the steady state", BY_HAND),
        ("Not compiling yet? Try `torch.compile` on your model in the child and measure it against the "
         "eager run before changing the script", PROBE_TREAT),
        ),
}


def playbook(skill: str) -> Playbook:
    return PLAYBOOKS[skill]
