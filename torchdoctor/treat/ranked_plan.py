"""Which trials to run on N ranks (``treat --nproc-per-node N``): pure, no torch.

Decided from what the ranks measured — the baseline's merged findings and rank 0's survey,
whose ``parallel`` record says how the model was wrapped (``DistributedDataParallel``,
``fully_shard``), with which bucket size and mixed-precision policy, on which backend — and
the device:

* the data-parallel trials (catalogue ``scope="ranked"``): ``ddp-bucket-cap`` (DDP whose
  parameters fill more than one bucket), ``fsdp-bf16`` (FSDP2 computing in float32; CUDA),
  ``compile-blocks`` (FSDP2 with blocks sharded apart from the root; CUDA);
* the one-process trials that stay valid under data parallelism, with the one-process rules of
  :mod:`.plan` (``fused-optimizer`` on DTensor parameters included: FSDP2's optimizer holds
  DTensor shards, the fused kernels take them); ``dataloader-workers`` counts the CPU cores per
  rank;
* the one-process trials that are **not** valid measurements on the wrapped model
  (:data:`~torchdoctor.treat.catalogue.RANKED_INVALID`: autocast and whole-model compile under
  FSDP2, channels-last after DDP or FSDP2 built their buffers) are listed as skipped with why,
  also when asked for with ``--try``.

Every treatment gets one line, planned or skipped with the reason; nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any, Iterable

from torchdoctor.treat.catalogue import (BUCKET_FACTOR, CATALOGUE, DDP_DEFAULT_MB, RANKED_INVALID,
                                         Treatment)
from torchdoctor.treat.plan import Plan, Planned, _chosen, _not_chosen, _possible


def wrappings(survey: dict[str, Any]) -> list[str]:
    """How the ranks' models were wrapped: ``"ddp"``, ``"fsdp2"`` (both when both were seen)."""
    par = survey.get("parallel") or {}
    return [w for w, key in (("ddp", "ddp"), ("fsdp2", "fsdp2")) if par.get(key)]


def bucket_target(survey: dict[str, Any], value: str | None) -> float:
    """The bucket size a ddp-bucket-cap trial sets (MiB): the value, or 4x the script's largest."""
    if value:
        return float(value)
    caps = [float(d.get("bucket_cap_mb") or DDP_DEFAULT_MB) for d in (survey.get("parallel") or {}).get("ddp") or []]
    return BUCKET_FACTOR * max(caps, default=DDP_DEFAULT_MB)


def _possible_ranked(t: Treatment, value: str | None, s: dict[str, Any], on_cuda: bool) -> str | None:
    par = s.get("parallel") or {}
    if t.device == "cuda" and not on_cuda:
        return "no CUDA"
    if t.name == "ddp-bucket-cap":
        ddps = par.get("ddp") or []
        if not ddps:
            return "no DistributedDataParallel built"
        if all(d.get("bucket_cap_mb_list") for d in ddps):
            return "the script sets bucket_cap_mb_list: its buckets are its own choice"
        want = bucket_target(s, value)
        if all(float(d.get("bucket_cap_mb") or DDP_DEFAULT_MB) >= want for d in ddps):
            return f"bucket_cap_mb already >= {want:g}"
        return None
    calls = par.get("fsdp2") or []
    if not calls:
        return "no fully_shard (FSDP2) call"
    if t.name == "fsdp-bf16":
        if all(c.get("param_dtype") for c in calls):
            return "every fully_shard call sets a MixedPrecisionPolicy param_dtype already"
        if not any("float32" in (c.get("dtypes") or []) for c in calls):
            return "no float32 parameters under fully_shard"
        if on_cuda and not (s.get("device") or {}).get("bf16"):
            return "this GPU does not support bf16"
        return None
    if t.name == "compile-blocks":
        if len(calls) < 2:
            return "fully_shard on one module only: no block sharded apart from the root to compile"
        models = s.get("models") or []
        if models and all(m.get("compiled") for m in models):
            return "the model is compiled already"
        return None
    return None


def _chosen_ranked(t: Treatment, s: dict[str, Any], codes: set[str], on_cuda: bool) -> str | None:
    par = s.get("parallel") or {}
    if t.name == "ddp-bucket-cap":
        over = [d for d in par.get("ddp") or []
                if (d.get("param_bytes") or 0) > float(d.get("bucket_cap_mb") or DDP_DEFAULT_MB) * 2**20]
        if not over:
            return None
        d = over[0]
        cap = float(d.get("bucket_cap_mb") or DDP_DEFAULT_MB)
        return (f"{d['param_bytes'] / 2**20:.0f} MiB of gradients in buckets of {cap:g} MiB: "
                f"at least {int(d['param_bytes'] // (cap * 2**20)) + 1} all-reduces a step")
    if not on_cuda:
        return None
    if t.name == "fsdp-bf16":
        return "CUDA: FSDP2 all-gathers and computes in float32"
    if t.name == "compile-blocks":
        return None if "dataloader-bound" in codes else "CUDA: the step is not data-bound"
    return None


def _not_chosen_ranked(t: Treatment) -> str:
    if t.name == "ddp-bucket-cap":
        return "the gradients fit in one bucket of the script's bucket_cap_mb: larger buckets change nothing"
    return _not_chosen(t)


def invalid_on(t: Treatment, wraps: list[str]) -> str | None:
    """Why the one-process trial ``t`` is not a valid measurement on ranks wrapped so, or None."""
    why = RANKED_INVALID.get(t.name) or {}
    hit = [why[w] for w in wraps if w in why]
    return f"not a valid trial on a data-parallel model: {hit[0]}" if hit else None


def ranked_plan(survey: dict[str, Any] | None, codes: Iterable[str], *, on_cuda: bool, nproc: int,
                forced: list[tuple[str, str | None]] | None = None,
                baseline_failure: str | None = None, baseline_oom: bool = False,
                peaks: dict[str, Any] | None = None) -> Plan:
    """The trials of a ranked treat run (see the module docstring); ``survey``: rank 0's."""
    s = dict(survey or {})
    if s.get("cpus"):  # the cores each rank may give its DataLoader workers
        s["cpus"] = max(1, int(s["cpus"]) // max(1, nproc))
    codes = set(codes)
    wraps = wrappings(s)
    out = Plan()
    wanted = dict(forced) if forced else None
    for t in CATALOGUE:
        if wanted is not None and t.name not in wanted:
            continue
        value = wanted.get(t.name) if wanted else None
        if baseline_failure and not (t.name == "expandable-segments" and baseline_oom):
            out.skipped.append((t.name, f"the baseline did not train: {baseline_failure}"))
            continue
        bad = invalid_on(t, wraps)
        if bad:
            out.skipped.append((t.name, bad))
            continue
        ranked = t.scope == "ranked"
        why_not = _possible_ranked(t, value, s, on_cuda) if ranked else _possible(t, value, s, on_cuda)
        if why_not and not (baseline_oom and t.name == "expandable-segments" and on_cuda):
            out.skipped.append((t.name, why_not))
            continue
        if wanted is not None:
            out.trials.append(Planned(t.name, value, "--try"))
            continue
        if t.device == "auto-cuda" and not on_cuda:
            out.skipped.append((t.name, f"no CUDA; `--try {t.name}` runs it on CPU"))
            continue
        why = _chosen_ranked(t, s, codes, on_cuda) if ranked else _chosen(t, codes, on_cuda, peaks)
        if why and t.name == "fused-optimizer" and any(o.get("dtensor") for o in s.get("optimizers") or []):
            why += ": the optimizer holds DTensor parameters (FSDP2's shards)"
        if why is None:
            out.skipped.append((t.name, _not_chosen_ranked(t) if ranked else _not_chosen(t)))
            continue
        out.trials.append(Planned(t.name, value, why))
    return out
