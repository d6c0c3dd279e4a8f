"""Which trials to run: from the baseline's findings, its survey and the device (pure, no torch).

Every treatment of the catalogue gets one line: planned (with why) or skipped (with the
reason). A treatment is *possible* when the script has what it changes (a map-style DataLoader
with fewer workers, an Adam/AdamW/SGD not fused, a Conv2d model, a zero_grad(set_to_none=False)
call, CUDA for the CUDA-only ones); it is *chosen* by itself when the evidence points at it
(dataloader-bound → dataloader-workers; memory-fragmentation, out-of-memory, or a baseline whose
CUDA reserved peak is fragmented by memory-fragmentation's own thresholds → expandable-segments;
CUDA → the GPU treatments). ``--try`` replaces the choice: exactly the
named treatments are tried, on CPU too where they have a CPU meaning — but never an impossible
one (tf32 on CPU: "no CUDA").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

# the baseline's CUDA allocator held far more than its peak of live tensors: its segments were
# fragmented. memory-fragmentation itself needs the memory probe's instruments; the baseline's
# peaks are measured in every treat run and judged with that rule's thresholds (FRAG_MIN_GAP
# bytes and FRAG_RATIO of the reserved peak unallocated).
from torchdoctor.rules.memory import FRAG_MIN_GAP, FRAG_RATIO
from torchdoctor.treat.catalogue import BF16, BY_NAME, CATALOGUE, REORDER, Treatment

MEMORY_CODES = ("memory-fragmentation", "out-of-memory")
LOW_PRECISION = ("bfloat16", "float16")
FUSABLE = ("Adam", "AdamW", "SGD")


@dataclass
class Planned:
    name: str
    value: str | None = None
    why: str = ""

    @property
    def treatment(self) -> Treatment:
        return BY_NAME[self.name]


@dataclass
class Plan:
    trials: list[Planned] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)


def default_workers(cpus: int | None) -> int:
    return max(2, min(8, cpus or 2))


def _possible(t: Treatment, value: str | None, s: dict[str, Any], on_cuda: bool) -> str | None:
    """None when the script has what ``t`` changes, else the reason it cannot apply."""
    models = s.get("models") or []
    fp32 = [m for m in models if "float32" in (m.get("dtypes") or [])]
    if t.device == "cuda" and not on_cuda:
        return "no CUDA"
    if t.name in ("dataloader-workers", "pin-memory"):
        loaders = [d for d in s.get("loaders") or [] if not d.get("iterable")]
        if not loaders:
            return ("no map-style torch DataLoader built" if not s.get("loaders")
                    else "only IterableDataset loaders (workers would each yield the whole stream)")
        if t.name == "pin-memory":
            return None if any(not d.get("pin_memory") for d in loaders) else "pin_memory=True already"
        n = int(value) if value else default_workers(s.get("cpus"))
        low = [d for d in loaders if int(d.get("num_workers") or 0) < n]
        if not low:
            return f"num_workers already >= {n} (of {s.get('cpus')} CPUs)"
        return None
    if t.name in ("tf32", "bf16-autocast", "channels-last", "compile", "cudnn-benchmark") and not models:
        return "no model forward seen"
    if t.name == "tf32":
        if not fp32:
            return "no float32 parameters"
        prec = (s.get("flags") or {}).get("float32_matmul_precision")
        return None if prec == "highest" else f"TF32 already allowed (float32 matmul precision {prec!r})"
    if t.name == "bf16-autocast":
        if any(m.get("autocast") for m in models):
            return "the script already runs its forward under autocast"
        if not fp32:
            return "no float32 parameters"
        if on_cuda and not (s.get("device") or {}).get("bf16"):
            return "this GPU does not support bf16"
        return None
    if t.name in ("channels-last", "cudnn-benchmark"):
        convs = [m for m in models if m.get("has_conv")]
        if not convs:
            return "no Conv2d in the model"
        if t.name == "channels-last":
            return None if not all(m.get("channels_last") for m in convs) else "channels-last already"
        if (s.get("flags") or {}).get("cudnn_benchmark"):
            return "torch.backends.cudnn.benchmark is on already"
        if any(m.get("shapes_vary") for m in convs):
            return "the input shapes change between steps: each new shape pays the search again"
        return None
    if t.name == "compile":
        return None if not all(m.get("compiled") for m in models) else "the model is compiled already"
    if t.name == "fused-optimizer":
        opts = [o for o in s.get("optimizers") or []
                if o.get("cls") in FUSABLE and str(o.get("module", "")).startswith("torch.optim")]
        if not opts:
            return "no torch.optim Adam/AdamW/SGD"
        return None if any(o.get("fused") is not True for o in opts) else "fused=True already"
    if t.name == "set-to-none":
        return None if s.get("zero_grad_false") else (
            "zero_grad already sets gradients to None (the default since torch 2.0)")
    if t.name == "expandable-segments":
        conf = str(s.get("alloc_conf") or "").lower()
        return "expandable_segments is on already" if "expandable_segments:true" in conf else None
    return None


def fragmented(peaks: dict[str, Any] | None) -> str | None:
    """Why the baseline's CUDA peaks say fragmentation (reserved >> allocated), or None."""
    a, r = (peaks or {}).get("allocated"), (peaks or {}).get("reserved")
    if not a or not r or r - a < FRAG_MIN_GAP or r - a < FRAG_RATIO * r:
        return None
    return f"the allocator reserved {r / a:.1f}x its peak of live tensors ({(r - a) / 2**20:.0f} MiB more)"


def tolerance_for(t: Treatment, survey: dict[str, Any] | None) -> float:
    """The loss tolerance of ``t`` for this script: a treatment that only reorders float math
    (``REORDER``) in a script that already computes in bf16/fp16 (autocast, or half
    parameters, or on ranks a ``fully_shard`` policy computing in bf16/fp16) changes rounding at
    *that* precision, so it gets the bf16 tolerance."""
    models = (survey or {}).get("models") or []
    low = any(m.get("autocast") or set(m.get("dtypes") or ()) & set(LOW_PRECISION) for m in models)
    shards = ((survey or {}).get("parallel") or {}).get("fsdp2") or []
    low = low or any(c.get("param_dtype") in LOW_PRECISION for c in shards)
    return max(t.tolerance, BF16) if low and t.tolerance == REORDER else t.tolerance


def _chosen(t: Treatment, codes: set[str], on_cuda: bool, peaks: dict[str, Any] | None = None) -> str | None:
    """Why the evidence points at ``t`` (it is tried by itself), or None."""
    if t.name == "dataloader-workers":
        return "dataloader-bound" if "dataloader-bound" in codes else None
    if t.name == "expandable-segments":
        hit = [c for c in MEMORY_CODES if c in codes]
        return hit[0] if hit else fragmented(peaks)
    if t.name == "set-to-none":
        return "zero_grad(set_to_none=False) in the script"
    if not on_cuda:
        return None
    if t.name == "pin-memory":
        return "pageable-h2d-copy" if "pageable-h2d-copy" in codes else "CUDA: a DataLoader without pin_memory"
    if t.name == "compile":
        return None if "dataloader-bound" in codes else "CUDA: the step is not data-bound"
    if t.name == "tf32":
        return next((c for c in ("fp32-compute-bound", "tf32-disabled") if c in codes), "CUDA: float32 matmuls")
    return "CUDA"


def plan(survey: dict[str, Any] | None, codes: Iterable[str], *, on_cuda: bool,
         forced: list[tuple[str, str | None]] | None = None, baseline_failure: str | None = None,
         baseline_oom: bool = False, peaks: dict[str, Any] | None = None) -> Plan:
    """``peaks``: the baseline's CUDA ``{"allocated", "reserved"}`` peak bytes (or None)."""
    s = survey or {}
    codes = set(codes)
    out = Plan()
    wanted = dict(forced) if forced else None
    for t in CATALOGUE:
        if wanted is not None and t.name not in wanted:
            continue
        if t.scope == "ranked":  # one process: the ranked trials are listed only when asked for
            if wanted is not None:
                out.skipped.append((t.name, "a trial of data parallelism: run "
                                            "`treat --nproc-per-node N` on the DDP/FSDP2 script"))
            continue
        value = wanted.get(t.name) if wanted else None
        if baseline_failure and not (t.name == "expandable-segments" and baseline_oom):
            out.skipped.append((t.name, f"the baseline did not train: {baseline_failure}"))
            continue
        why_not = _possible(t, value, s, on_cuda)
        if why_not and not (baseline_oom and t.name == "expandable-segments" and on_cuda):
            out.skipped.append((t.name, why_not))
            continue
        if wanted is not None:
            out.trials.append(Planned(t.name, value, "--try"))
            continue
        if t.device == "auto-cuda" and not on_cuda:
            out.skipped.append((t.name, f"no CUDA; `--try {t.name}` runs it on CPU"))
            continue
        why = _chosen(t, codes, on_cuda, peaks)
        if why is None:
            out.skipped.append((t.name, _not_chosen(t)))
            continue
        out.trials.append(Planned(t.name, value, why))
    return out


def _not_chosen(t: Treatment) -> str:
    if t.name == "dataloader-workers":
        return "the loop does not wait for data (no dataloader-bound)"
    if t.name == "expandable-segments":
        return "no memory-fragmentation or out-of-memory, reserved memory close to the live peak"
    if t.name == "compile":
        return "the step is data-bound: compiling the model would not shorten the wait"
    return "nothing points at it"


def combination(adopted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The adopted trials to combine: every adopted one, but of a group (``precision``) only the
    fastest. Fewer than two: no combined trial."""
    best: dict[str, dict[str, Any]] = {}
    out = []
    for a in adopted:
        g = BY_NAME[a["name"]].group
        if not g:
            out.append(a)
        elif g not in best or (a.get("speedup") or 0) > (best[g].get("speedup") or 0):
            best[g] = a
    out += best.values()
    order = [t.name for t in CATALOGUE]
    return sorted(out, key=lambda a: order.index(a["name"])) if len(out) >= 2 else []
