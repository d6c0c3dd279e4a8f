"""Out-of-memory fixes ranked by what they would save (recognising the OOM and reading its
message is the crash rule's job: :mod:`torchdoctor.rules.crash`).

Savings are estimates from the measured breakdown, each with the arithmetic it rests on
(docs/findings/out-of-memory.md lists them):

* bf16 autocast: float32 activations are stored in 16 bits -> about half of the measured
  float32 activation bytes;
* halving the micro-batch (with 2x gradient accumulation, same effective batch):
  activations scale with the batch -> about half of the activations;
* activation checkpointing of the model's ``n`` blocks: only block inputs are kept plus one
  block's activations during recompute -> about ``(1 - 2/n)`` of the activations (n >= 3);
* ``zero_grad(set_to_none=True)`` right after ``step()``: gradients still allocated while the
  forward runs are freed -> the gradient bytes present at that moment;
* a lighter optimizer (8-bit Adam / Adafactor, or SGD with momentum instead of Adam):
  at least half of the optimizer state;
* ``expandable_segments:True``: reserved-but-free bytes the allocator could not reuse.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.memory.units import human_bytes

MIN_SHORTFALL_SHARE = 0.1  # a fix saving less than 10% of the missing bytes is not worth listing

def rank_fixes(parts: dict[str, int], extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Fixes with estimated savings in bytes, biggest first.

    ``parts``: measured bytes: parameters, gradients, optimizer_state, activations.
    ``extra``: activations_fp32, gradients_at_forward, n_blocks, cached_free, autocast (bool),
    and for an OOM: requested, free, capacity (bytes) and where (the failing user line).
    When the shortfall (requested - free) is known, fixes that would save less than
    MIN_SHORTFALL_SHARE of it are left out; a single request larger than the whole capacity
    gets its own first fix.
    """
    act = int(parts.get("activations", 0) or 0)
    act32 = int(extra.get("activations_fp32", 0) or 0)
    fixes: list[dict[str, Any]] = []

    def add(key: str, saves: float, text: str) -> None:
        if saves > 0:
            fixes.append({"fix": key, "saves": int(saves), "how": text})

    if act32 and not extra.get("autocast"):
        add("bf16-autocast", act32 / 2,
            "run forward under torch.autocast(device_type, dtype=torch.bfloat16): "
            "float32 activations are kept in 16 bits")
    n = int(extra.get("n_blocks", 0) or 0)
    if act and n >= 3:
        add("activation-checkpointing", act * (1 - 2 / n),
            f"wrap each of the {n} blocks in torch.utils.checkpoint.checkpoint(..., use_reentrant=False): "
            "keeps block inputs only, recomputes the rest in backward (~30% more compute)")
    if act:
        add("smaller-micro-batch", act / 2,
            "halve the batch per step and accumulate gradients over 2 steps (same effective batch)")
    g = int(extra.get("gradients_at_forward", 0) or 0)
    if g:
        add("zero-grad-set-to-none", g,
            "call optimizer.zero_grad(set_to_none=True) right after optimizer.step() (before the "
            "next forward): the gradients were still allocated while this forward ran")
    opt = int(parts.get("optimizer_state", 0) or 0)
    if opt:
        add("lighter-optimizer-state", opt / 2,
            "an optimizer with less state: 8-bit Adam (bitsandbytes), Adafactor, or SGD+momentum "
            "(Adam keeps 2 float32 tensors per parameter)")
    cached = int(extra.get("cached_free", 0) or 0)
    if cached:
        add("expandable-segments", cached,
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: lets the allocator reuse "
            "reserved-but-free memory")
    fixes.sort(key=lambda f: -f["saves"])
    req, free, cap = (int(extra.get(k) or 0) for k in ("requested", "free", "capacity"))
    if req and free:
        shortfall = max(0, req - free)
        fixes = [f for f in fixes if f["saves"] >= MIN_SHORTFALL_SHARE * shortfall]
        for f in fixes:
            f["covers_shortfall"] = f["saves"] >= shortfall
    if req and cap and req > cap:
        where = f" at {extra['where']}" if extra.get("where") else ""
        fixes.insert(0, {"fix": "shrink-the-allocation", "saves": req, "covers_shortfall": True,
                         "how": f"one request of {human_bytes(req)}{where} is larger than the whole "
                                f"{human_bytes(cap)}: shrink that tensor (batch size, sequence "
                                "length, a wrong shape)"})
    return fixes


def fix_lines(fixes: list[dict[str, Any]], limit: int = 5) -> list[str]:
    """Human lines: 'key (saves ~X): how'."""
    out = []
    for f in fixes[:limit]:
        gain = "" if f["fix"] == "shrink-the-allocation" else f" (saves ~{human_bytes(f['saves'])})"
        out.append(f"{f['how'][0].upper()}{f['how'][1:]}{gain}")
    return out


def oom_context(measured: dict[str, Any], parsed: dict[str, Any], phase: str | None,
                where: str | None) -> tuple[dict[str, Any], list[str]]:
    """The crash finding's out-of-memory evidence and ranked fixes, computed in the parent.

    ``measured``: what the memory sampler recorded in the child at the crash (its
    ``crash_context`` event's ``oom``): ``evidence`` (allocator / host numbers, top sites,
    snapshot) and ``live`` (``parts``: bytes per kind; ``activations_fp32``, ``n_blocks``).
    ``parsed``: the numbers read from the OOM message (the crash rule's ``oom_details``);
    ``phase``: the loop phase of the crash (from its traceback); ``where``: the failing user line.
    """
    ev = dict(measured.get("evidence") or {})
    live = measured.get("live") or {}
    ev.setdefault("requested_bytes", parsed.get("requested_bytes"))
    parts = dict(live.get("parts") or {})
    ev["breakdown"] = " · ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in parts.items())
    ev["breakdown_bytes"] = parts
    fixes = rank_fixes(parts, {
        "activations_fp32": live.get("activations_fp32", 0), "n_blocks": live.get("n_blocks", 0),
        # gradients alive while the forward runs are what set_to_none would free
        "gradients_at_forward": parts.get("gradients", 0) if phase == "forward" else 0,
        "cached_free": parts.get("cached_free", 0), "requested": ev.get("requested_bytes"),
        "free": ev.get("free_bytes"), "capacity": ev.get("capacity_bytes"), "where": where})
    if fixes:
        ev["estimated_savings"] = {f["fix"]: human_bytes(f["saves"]) for f in fixes}
    return {k: v for k, v in ev.items() if v is not None}, fix_lines(fixes)
