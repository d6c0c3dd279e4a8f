"""Check every sampled call after the run, within a time budget; emit one event per call.

Runs in the child after the script ended and the capture patch was undone. Grad mode is turned on
(the script may have left it off), inference mode off, and the global RNG state is restored after
(``torch.random.fork_rng``) although it is re-seeded for every forward. The budget is the smaller
of ``--budget`` (default ``CHECK_BUDGET_S``) and what is left of ``--timeout``; a call that does not
fit is reported as not checked, never dropped silently. One call may use at most half of what is
left, so one slow Function cannot starve the others.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable

from torchdoctor.gradcheck.limits import CHECK_BUDGET_S


def check_all(torch, book: Any, infos: dict, emit: Callable[..., None], budget_s: float | None,
              left_s: float | None) -> dict[str, Any]:
    from torchdoctor.gradcheck.check import check_call

    budget = CHECK_BUDGET_S if budget_s is None else budget_s
    if left_s is not None:
        budget = max(0.0, min(budget, left_s))
    t0 = time.monotonic()
    deadline = t0 + budget
    sampled = sum(len(v) for v in book.kept.values())
    checked = 0
    devices = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = [torch.cuda.current_device()]
    sink = _Sink()
    with torch.random.fork_rng(devices=devices), torch.enable_grad(), torch.inference_mode(False), \
            contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls, kept in list(book.kept.items()):
            info = infos.get(cls, {})
            for k, rec in enumerate(kept):
                base = {"function": info.get("function"), "forward_at": info.get("forward_at"),
                        "backward_at": info.get("backward_at"), "input_names": info.get("inputs"),
                        "sample": k, "call": rec.get("call"),
                        "step": rec.get("step"), "call_site": rec.get("site"),
                        "shapes": rec.get("shapes"), "dtypes": rec.get("dtypes"),
                        "requires_grad": rec.get("requires"), "device": rec.get("device"),
                        "captured_reduced": rec.get("reduced")}
                now = time.monotonic()
                if now >= deadline:
                    emit("gradcheck_call", **base, status="not-checked",
                         reason=f"the check budget ({budget:.0f} s) was spent")
                    continue
                fn = cls.apply if isinstance(cls, type) else cls  # a Function, or a custom op
                try:
                    res = check_call(torch, fn, rec, now + (deadline - now) / 2)
                except Exception as e:  # noqa: BLE001 - a check that breaks is reported, not raised
                    res = {"status": "skipped", "reason": f"the check failed: {type(e).__name__}: {str(e)[:300]}"}
                if info.get("is_op") and k == 0 and time.monotonic() < deadline:
                    res["opcheck"] = opcheck(torch, cls, rec)
                if res.get("status") != "skipped":
                    checked += 1
                emit("gradcheck_call", **base, **res)
    return {"sampled": sampled, "checked": checked, "seconds": round(time.monotonic() - t0, 3),
            "budget_s": round(budget, 1), "output_dropped": sink.writes}


class _Sink:
    """A text stream that drops what is written to it (and counts the writes)."""

    writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return len(s)

    def flush(self) -> None:
        pass


OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor")


def opcheck(torch, op: Any, rec: dict[str, Any]) -> dict[str, str]:
    """``torch.library.opcheck`` of a custom op on one captured call (its own dtypes, on its
    device; the inputs that required grad require grad): {test: "SUCCESS" | "Error: text"}.
    ``test_aot_dispatch_dynamic`` is left out (it compiles: seconds to minutes)."""
    fn = getattr(getattr(torch, "library", None), "opcheck", None)
    if fn is None:
        return {"opcheck": "not in this torch"}
    device = rec.get("device") or "cpu"
    args = []
    for a, req in zip(rec["args"], rec["requires"]):
        if isinstance(a, torch.Tensor):
            a = a.to(device)
            if req and a.is_floating_point():
                a = a.detach().requires_grad_(True)
        args.append(a)
    try:
        out = fn(op, tuple(args), test_utils=OPCHECK_TESTS, raise_exception=False)
    except Exception as e:  # noqa: BLE001
        return {"opcheck": f"{type(e).__name__}: {str(e)[:300]}"}
    return {str(k): ("SUCCESS" if v == "SUCCESS" else f"{type(v).__name__}: {str(v)[:400]}")
            for k, v in (out or {}).items()}
