"""Analytical vs numerical gradient of one input, element by element, on a random projection.

The outputs are projected on a fixed random direction ``v`` (``s = sum(v * out)``): one backward
gives ``ds/dx`` for every element of every input (the analytical side); for each compared element
``j`` the numerical side is the central difference ``(s(x + h e_j) - s(x - h e_j)) / 2h``, two
forwards. So the cost is two forwards per compared element, whatever the output size, and the
worst element is known. For each element that disagrees beyond ``ATOL + RTOL * |numerical|``:

* the one-sided differences (``left``, ``right``, no extra forward) tell a **kink** (ReLU at 0, an
  ``abs``, a threshold, a jump) where the numerical derivative means nothing: not counted;
* the larger step ``EPS_CONFIRM * max(1, |x_j|)`` must **confirm** the disagreement (a forward
  that computes in float32 inside gives rounding noise at the small step, not at the large one):
  confirmed elements are what a wrong backward shows; unconfirmed ones are counted as imprecise.

Measured, not judged: the counts, the worst element, whether the numerical gradient is zero on
every compared element and whether the output changes at all when the input moves a lot
(``forward_varies``) are emitted; the rules decide what they mean.
"""

from __future__ import annotations

from typing import Any, Callable

from torchdoctor.gradcheck.limits import ATOL, EPS, EPS_CONFIRM, LOCATE_ELEMENTS, RTOL


def _beyond(a: float, n: float) -> bool:
    return abs(a - n) > ATOL + RTOL * abs(n)


def compare_input(torch, s_at: Callable[[Any], float], x: Any, analytic: Any, gen: Any,
                  deadline: Callable[[], bool], outputs_of: Callable[[Any], list] | None = None
                  ) -> dict[str, Any]:
    """Compare ``analytic`` (ds/dx, same shape as x) with central differences of ``s_at(x')``."""
    base = x.detach().clone(memory_format=torch.contiguous_format)
    n = base.numel()
    if n <= LOCATE_ELEMENTS:
        idx = list(range(n))
    else:
        idx = sorted(torch.randperm(n, generator=gen)[:LOCATE_ELEMENTS].tolist())
    a_flat = analytic.detach().reshape(-1).to("cpu", torch.float64)
    x_flat = base.reshape(-1).to("cpu")
    s0 = s_at(base)

    def s_moved(j: int, h: float) -> float:
        moved = base.clone()
        moved.view(-1)[j] += h
        return s_at(moved)

    rec: dict[str, Any] = {"elements": n, "compared": 0, "sampled": n > len(idx), "beyond": 0,
                           "kinks": 0, "imprecise": 0, "confirmed": 0}
    max_num = max_ana = 0.0
    worst = None
    first_beyond = None
    for j in idx:
        if deadline():
            rec["partial"] = True
            break
        sp, sm = s_moved(j, EPS), s_moved(j, -EPS)
        central = (sp - sm) / (2 * EPS)
        a = float(a_flat[j])
        rec["compared"] += 1
        max_ana = max(max_ana, abs(a))
        left, right = (s0 - sm) / EPS, (sp - s0) / EPS
        kink = abs(left - right) > ATOL + RTOL * max(abs(left), abs(right))
        if not kink:
            max_num = max(max_num, abs(central))
        if not _beyond(a, central):
            continue
        rec["beyond"] += 1
        if kink:
            rec["kinks"] += 1
            continue
        h = EPS_CONFIRM * max(1.0, abs(float(x_flat[j])))
        central2 = (s_moved(j, h) - s_moved(j, -h)) / (2 * h)
        if not _beyond(a, central2):
            rec["imprecise"] += 1
            first_beyond = first_beyond or (j, a, central)
            continue
        rec["confirmed"] += 1
        err = abs(a - central)
        if worst is None or err > worst[3]:
            worst = (j, a, central, err)
    rec["max_numerical"] = max_num
    rec["max_analytical"] = max_ana
    rec["numerical_zero"] = rec["compared"] > rec["kinks"] and max_num <= ATOL
    if worst is not None:
        j, a, num, err = worst
        rec["worst"] = {"index": _unravel(j, tuple(base.shape)), "analytical": a, "numerical": num,
                        "abs_error": err, "rel_error": (err / abs(num)) if num != 0 else None}
        rec["max_abs_error"] = err
        rec["max_rel_error"] = rec["worst"]["rel_error"]
        if rec["numerical_zero"] and outputs_of is not None:
            rec["forward_varies"] = _varies(torch, base, outputs_of, gen)
    return rec


def _varies(torch, base: Any, outputs_of: Callable[[Any], list], gen: Any) -> bool:
    """Does the output change at all when the input moves by about its own scale?"""
    scale = max(1.0, float(base.abs().max())) if base.numel() else 1.0
    noise = torch.randn(base.shape, dtype=base.dtype, generator=gen).to(base.device)
    a, b = outputs_of(base), outputs_of(base + 0.5 * scale * noise)
    return any(not torch.equal(x, y) for x, y in zip(a, b))


def _unravel(j: int, shape: tuple) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(j % d if d else 0)
        j = j // d if d else 0
    return list(reversed(out))
