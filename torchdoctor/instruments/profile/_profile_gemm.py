"""Matmuls by the alignment of their dimensions: the ``profile_gemm_shapes`` payload.

Tensor-core GEMM kernels move 16 bytes at a time; a matmul whose M, N or K is not a multiple of
16 bytes' worth of elements (8 for 16-bit types, 4 for float32/TF32) runs on kernels that cannot
(cutlass's ``align1``/``align2`` kernels on an H200, where llm.c's GPT-2 vocabulary of 50257 put
its three output-layer GEMMs). Each matmul op of the window (``aten::mm``, ``addmm``, ``bmm``,
``baddbmm``, ``_addmm_activation``, with the input sizes ``record_shapes`` kept) is read as
(batch, M, K, N), its FLOPs 2·batch·M·N·K, its device time the kernels linked to it by correlation
id. Only matmuls of at least GEMM_MIN_FLOP each are compared (small ones are bound by launch and
memory, not by the kernel's alignment). Pure Python over the flat; no torch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdoctor.instruments.profile._profile_flat import TOP_N, Sources, Window, _ms, _site_dict, site_of

GEMM_MIN_FLOP = 1e9  # per call: smaller matmuls are not judged by their alignment
ALIGN_ELEMENTS = {"float16": 8, "half": 8, "bfloat16": 8, "float32": 4, "float": 4}
_BIAS_FIRST = {"aten::addmm", "aten::baddbmm", "aten::_addmm_activation"}


def dims(name: str, shapes: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a matmul op from its input sizes, or None."""
    a_b = shapes[1:3] if name in _BIAS_FIRST else shapes[:2]
    if len(a_b) < 2 or not a_b[0] or not a_b[1]:
        return None
    a, b = a_b
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 1, a[0], a[1], b[1]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return a[0], a[1], a[2], b[2]
    return None


def gemm_shapes(w: Window, src: Sources) -> dict[str, Any]:
    """Per-step device time and FLOP rate of the big matmuls, aligned vs not, and the
    unaligned ones by shape and user line."""
    n = max(1, w.n_steps)
    dev = defaultdict(int)  # op node -> ns of its kernels
    for d in w.device:
        if d[1] == "kernel" and d[5]:
            idx = w.by_corr.get(d[5])
            if idx is not None:
                dev[idx] += d[3] - d[2]
    tot = {"aligned": [0, 0.0], "unaligned": [0, 0.0]}  # ns, flop
    rows: dict[tuple, list] = {}
    for idx, ns in dev.items():
        op = w.nodes[idx]
        shapes = op[7].get("shapes")
        if not shapes or ns <= 0:
            continue
        d4 = dims(op[3], shapes)
        ins = op[7].get("in") or []
        dtype = next((x[0] for x in ins if x), None)
        align = ALIGN_ELEMENTS.get(str(dtype))
        if d4 is None or align is None:
            continue
        batch, m, k, nn = d4
        flop = 2.0 * batch * m * k * nn
        if flop < GEMM_MIN_FLOP:
            continue
        odd = [x for x in (m, k, nn) if x % align]
        key = "unaligned" if odd else "aligned"
        tot[key][0] += ns
        tot[key][1] += flop
        if odd:
            site = site_of(w, idx, src)
            rk = (op[3], (batch, m, k, nn), str(dtype), site.key)
            r = rows.setdefault(rk, [0, 0, 0.0, site])
            r[0] += 1
            r[1] += ns
            r[2] += flop
    out_rows = []
    for (name, (batch, m, k, nn), dtype, _), (calls, ns, flop, site) in sorted(
            rows.items(), key=lambda kv: -kv[1][1])[:TOP_N]:
        shape = (f"{batch}×" if batch > 1 else "") + f"[{m}×{k}]·[{k}×{nn}]"
        out_rows.append({"op": name, "shape": shape, "dtype": dtype, **_site_dict(site),
                         "calls": round(calls / n, 2), "device_ms": _ms(ns / n),
                         "tflops": round(flop / ns / 1e3, 1)})
    out: dict[str, Any] = {"min_flop": GEMM_MIN_FLOP, "unaligned": out_rows}
    for key, (ns, flop) in tot.items():
        out[f"{key}_ms"] = _ms(ns / n)
        out[f"{key}_tflops"] = round(flop / ns / 1e3, 1) if ns else None
    return out
