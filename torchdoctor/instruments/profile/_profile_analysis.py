"""Analysis of one profiler window: a "flat" (see ``_profiler_compat``) → compact evidence.

Pure Python over plain data: no torch, no GPU. The profiler-window instrument calls
:func:`analyze` in the child right after the window and emits each payload as one evidence
event; tests call it on saved or synthetic flats.

Units: every duration in the payloads is in milliseconds per *active step* unless the key
says otherwise (``_us`` = microseconds, ``_ms`` = milliseconds, ``bytes``). "Step" = the time
between two optimizer steps (the ``ProfilerStep#N`` ranges of the trace).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchdoctor.instruments.profile._profile_flat import (  # noqa: F401 - Sources, Window re-exported
    GEMM_OPS, PY_NAME, SYNC_CALL, TOP_N, Site, Sources, Window, _is_annotation, _is_conv, _ms,
    _op_bytes, _site_dict, _union, site_of)




# --------------------------------------------------------------------------- sections

def window_summary(w: Window) -> dict[str, Any]:
    """Which optimizer steps were recorded (1-based, as the step clock counts them).

    ``ProfilerStep#N`` opens when step N ends, so it covers step N + 1.
    """
    ms = [_ms(e - s) for _n, s, e in w.steps]
    return {"active_steps": w.n_steps, "steps": [n + 1 for n, _s, _e in w.steps],
            "profiled_step_ms": ms, "truncated": bool(w.flat.get("truncated")),
            "open_step_dropped": w.open_step_dropped}


def top_ops(w: Window) -> dict[str, Any]:
    """Torch ops by self CPU time, and by device time of the kernels they launched."""
    n = max(1, w.n_steps)
    child_ops = defaultdict(int)
    spans = [w.span_of(node) for node in w.nodes]  # None: after a partial window's last step
    for node in w.nodes:
        sp = spans[node[0]]
        if sp and node[2] == "op" and node[1] >= 0 and w.nodes[node[1]][2] == "op":
            child_ops[node[1]] += sp[1] - sp[0]
    dev_by_corr = defaultdict(int)
    for d in w.device:
        if d[5]:
            dev_by_corr[d[5]] += d[3] - d[2]
    agg: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0])  # calls, self, total, device
    for node in w.nodes:
        sp = spans[node[0]]
        if sp is None or node[2] != "op" or _is_annotation(node):
            continue
        dur = sp[1] - sp[0]
        a = agg[node[3]]
        a[0] += 1
        a[1] += max(0, dur - child_ops.get(node[0], 0))
        a[2] += dur
        a[3] += dev_by_corr.get(node[7].get("corr"), 0)
    rows = [{"name": k, "calls": round(v[0] / n, 2), "self_cpu_ms": _ms(v[1] / n),
             "cpu_total_ms": _ms(v[2] / n), "device_ms": _ms(v[3] / n)} for k, v in agg.items()]
    by_cpu = sorted(rows, key=lambda r: -r["self_cpu_ms"])[:TOP_N]
    by_dev = [r for r in sorted(rows, key=lambda r: -r["device_ms"]) if r["device_ms"] > 0][:TOP_N]
    return {"by_self_cpu": by_cpu, "by_device": by_dev,
            "self_cpu_ms": _ms(sum(v[1] for v in agg.values()) / n)}


def top_kernels(w: Window) -> dict[str, Any]:
    n = max(1, w.n_steps)
    agg: dict[str, list] = defaultdict(lambda: [0, 0, ""])
    for d in w.device:
        a = agg[d[0]]
        a[0] += 1
        a[1] += d[3] - d[2]
        a[2] = d[1]
    rows = [{"name": (k if len(k) <= 120 else k[:117] + "..."), "kind": v[2],
             "calls": round(v[0] / n, 2), "device_ms": _ms(v[1] / n),
             "mean_us": round(v[1] / v[0] / 1e3, 2) if v[0] else 0.0} for k, v in agg.items()]
    rows.sort(key=lambda r: -r["device_ms"])
    return {"rows": rows[:TOP_N], "distinct": len(rows)}


def device_time(w: Window) -> dict[str, Any]:
    """GPU busy time (union of kernel/copy/memset intervals) and kernel statistics per step,
    over the device work launched by the recorded steps."""
    n = max(1, w.n_steps)
    dev = w.device
    kernels = [d[3] - d[2] for d in dev if d[1] == "kernel"]
    busy = _union([(d[2], d[3]) for d in dev])
    kernels.sort()
    return {"gpu_busy_ms": _ms(busy / n), "kernels_per_step": round(len(kernels) / n, 1),
            "kernel_ms": _ms(sum(kernels) / n),
            "median_kernel_us": round(kernels[len(kernels) // 2] / 1e3, 2) if kernels else 0.0,
            "device_events": len(dev), "not_launched_in_window": w.device_unlaunched}


def syncs(w: Window, src: Sources) -> dict[str, Any]:
    """Host-blocking CUDA calls per step, classified and attributed to the user's line.

    ``d2h``: waits for device results (``.item()``, ``.cpu()``, printing, ``torch.cuda.synchronize``).
    Not counted as d2h: the wait of a blocking host→device copy (``h2d_copy``: judged by the
    pageable-copy rule), GradScaler's own inf check (``grad_scaler``: by design), and calls made
    by torchdoctor itself (``tool``).
    """
    memcpy_dir: dict[int, set] = defaultdict(set)
    for d in w.device:
        if d[1] == "memcpy" and d[5]:
            memcpy_dir[d[5]].add("HtoD" if "HtoD" in d[0] else ("DtoH" if "DtoH" in d[0] else "other"))
    per_step = [0] * w.n_steps
    wait_ns = 0
    sites: dict[str, dict] = {}
    excluded: dict[str, int] = defaultdict(int)
    for r in w.flat.get("runtime", []):
        name, start, end, _corr, link = r[0], r[1], r[2], r[3], r[4]
        if not SYNC_CALL.match(name):
            continue
        i = w.step_index(start)
        if i is None:
            continue
        op_idx = w.by_corr.get(link) if link else None
        anchor = op_idx if op_idx is not None else w.enclosing(start)
        site = site_of(w, anchor, src) if anchor is not None else Site()
        op_name = w.nodes[op_idx][3] if op_idx is not None else None
        if site.tool:
            excluded["tool"] += 1
            continue
        if op_idx is not None and "HtoD" in memcpy_dir.get(link, ()) and "DtoH" not in memcpy_dir.get(link, ()):
            excluded["h2d_copy"] += 1
            continue
        if any("grad_scaler" in f for f in site.lib_files):
            excluded["grad_scaler"] += 1
            continue
        per_step[i] += 1
        wait_ns += end - start
        s = sites.setdefault(site.key, {**_site_dict(site), "count": 0, "wait_ns": 0, "calls": set(),
                                        "ops": set()})
        s["count"] += 1
        s["wait_ns"] += end - start
        s["calls"].add(name)
        if op_name:
            s["ops"].add(op_name)
    n = max(1, w.n_steps)
    rows = []
    for s in sorted(sites.values(), key=lambda s: -s["count"]):
        s["per_step"] = round(s.pop("count") / n, 2)
        s["wait_ms"] = _ms(s.pop("wait_ns") / n)
        s["calls"] = sorted(s["calls"])
        s["ops"] = sorted(s["ops"])
        rows.append(s)
    return {"per_step": per_step, "wait_ms": _ms(wait_ns / n), "sites": rows[:TOP_N],
            "excluded": dict(excluded)}


def copies(w: Window, src: Sources) -> dict[str, Any]:
    """Memcpy kinds, and pageable host→device copies per step with the user's line."""
    n = max(1, w.n_steps)
    kinds: dict[str, list] = defaultdict(lambda: [0, 0, 0])
    per_step = [0] * w.n_steps
    bytes_step = [0] * w.n_steps
    sites: dict[str, dict] = {}
    pageable_ns = 0
    for d in w.device:
        if d[1] != "memcpy":
            continue
        op_idx = w.by_corr.get(d[5]) if d[5] else None
        b = d[7] if d[7] is not None else (_op_bytes(w.nodes[op_idx]) if op_idx is not None else None)
        k = kinds[d[0]]
        k[0] += 1
        k[1] += b or 0
        k[2] += d[3] - d[2]
        if "HtoD" not in d[0] or "Pageable" not in d[0]:
            continue
        t = w.nodes[op_idx][5] if op_idx is not None else d[2]
        i = w.step_index(t)
        if i is None:
            continue
        site = site_of(w, op_idx, src) if op_idx is not None else Site()
        if site.tool:
            continue
        per_step[i] += 1
        bytes_step[i] += b or 0
        pageable_ns += d[3] - d[2]
        s = sites.setdefault(site.key, {**_site_dict(site), "count": 0, "bytes": 0})
        s["count"] += 1
        s["bytes"] += b or 0
    rows = sorted(sites.values(), key=lambda s: -s["bytes"])
    for s in rows:
        s["per_step"] = round(s.pop("count") / n, 2)
        s["bytes_per_step"] = int(s.pop("bytes") / n)
    kind_rows = [{"kind": k, "per_step": round(v[0] / n, 2), "bytes_per_step": int(v[1] / n),
                  "device_ms": _ms(v[2] / n)} for k, v in sorted(kinds.items())]
    return {"kinds": kind_rows, "pageable_h2d_per_step": per_step,
            "pageable_h2d_bytes_per_step": bytes_step, "pageable_h2d_ms": _ms(pageable_ns / n),
            "pageable_sites": rows[:TOP_N]}


def gemm(w: Window, src: Sources, flags: dict[str, Any]) -> dict[str, Any]:
    """Device time of matmul/conv kernels by input dtype; float32 without TF32 singled out."""
    n = max(1, w.n_steps)
    total = 0
    mm_conv = 0
    fp32_plain = 0
    by_dtype: dict[str, int] = defaultdict(int)
    ops: dict[tuple, list] = {}
    kernels: dict[str, int] = defaultdict(int)
    for d in w.device:
        if d[1] != "kernel":
            continue
        dur = d[3] - d[2]
        total += dur
        op_idx = w.by_corr.get(d[5]) if d[5] else None
        if op_idx is None:
            continue
        op = w.nodes[op_idx]
        name = op[3]
        conv = _is_conv(name)
        if name not in GEMM_OPS and not conv:
            continue
        mm_conv += dur
        ins = op[7].get("in") or []
        dtype = next((x[0] for x in ins if x), "unknown")
        by_dtype[dtype] += dur
        if dtype not in ("float32", "float"):
            continue
        if conv:
            tf32 = bool(flags.get("cudnn_allow_tf32", True))
        else:
            tf32 = op[7].get("tf32")
            if tf32 is None:
                tf32 = bool(flags.get("matmul_allow_tf32", False))
        if "tf32" in d[0].lower():
            tf32 = True
        if tf32:
            continue
        fp32_plain += dur
        kernels[d[0] if len(d[0]) <= 100 else d[0][:97] + "..."] += dur
        site = site_of(w, op_idx, src)
        k2 = (name, site.key)
        if k2 not in ops:
            ops[k2] = [0, 0, site]
        ops[k2][0] += 1
        ops[k2][1] += dur
    op_rows = []
    for (name, _k), (calls, dur, site) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:TOP_N]:
        op_rows.append({"op": name, **_site_dict(site), "calls": round(calls / n, 2),
                        "device_ms": _ms(dur / n)})
    return {"kernel_ms": _ms(total / n), "mm_conv_ms": _ms(mm_conv / n), "fp32_plain_ms": _ms(fp32_plain / n),
            "mm_conv_by_dtype_ms": {k: _ms(v / n) for k, v in sorted(by_dtype.items(), key=lambda kv: -kv[1])},
            "fp32_kernels": [{"name": k, "device_ms": _ms(v / n)}
                             for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:5]],
            "fp32_ops": op_rows}


def host(w: Window, src: Sources) -> dict[str, Any]:
    """Where the main thread's time goes within the profiled steps (CPU view), per step.

    ``ops_ms``: union of top-level torch op intervals (record_function ranges excluded, the ops
    inside them included); ``python_ms``: the rest of the step on the main thread. Medians over
    the active steps; ``ops_ms_min``: the least-disturbed step (preemption by a busy neighbour
    only ever adds time, so the minimum is the best estimate of the work itself).
    """
    import statistics

    if not w.steps:
        return {}
    per_step: list[list[tuple[int, int]]] = [[] for _ in w.steps]
    for node in w.nodes:
        if node[2] != "op" or node[4] != w.main_tid or _is_annotation(node):
            continue
        top = True
        for a in w.ancestors(node[0]):
            if a[2] == "op" and not _is_annotation(a):
                top = False
                break
        if not top:
            continue
        for i, (_n, s, e) in enumerate(w.steps):
            if node[6] > s and node[5] < e:
                per_step[i].append((max(s, node[5]), min(e, node[6])))
    ops = [_union(iv) for iv in per_step]
    spans = [e - s for _n, s, e in w.steps]
    rest = [max(0, sp - o) for sp, o in zip(spans, ops)]
    return {"profiled_step_ms": _ms(statistics.median(spans)), "ops_ms": _ms(statistics.median(ops)),
            "python_ms": _ms(statistics.median(rest)), "ops_ms_min": _ms(min(ops)),
            "ops_ms_per_step": [_ms(o) for o in ops]}


def python_hotspots(w: Window, src: Sources) -> dict[str, Any]:
    """User functions by self time (Python outside torch ops and calls), per step.

    ``in_data``: the function ran inside the DataLoader's ``__next__`` (a dataset or collate).
    """
    n = max(1, w.n_steps)
    child = defaultdict(int)
    spans = [w.span_of(node) for node in w.nodes]  # None: after a partial window's last step
    for node in w.nodes:
        p = node[1]
        sp = spans[node[0]]
        if sp and p >= 0 and w.nodes[p][2] == "py":
            child[p] += sp[1] - sp[0]
    agg: dict[str, list] = {}
    # node name -> ("file:def line", func), None when not the user's; one source walk per name
    keys: dict[str, tuple[str, str] | None] = {}
    # in_data per node in one pass (depth-first order: a parent comes before its children), not
    # an ancestor walk per call: linear in the nodes however deep the Python stacks
    in_data = [False] * len(w.nodes)
    for node in w.nodes:
        p = node[1]
        if p >= 0:
            pn = w.nodes[p]
            in_data[node[0]] = in_data[p] or (pn[2] == "op" and pn[3].startswith("enumerate(DataLoader)"))
        if node[2] != "py" or spans[node[0]] is None:
            continue
        if node[3] not in keys:
            m = PY_NAME.match(node[3])
            keys[node[3]] = None
            if m and src.is_user(m.group("file")):
                line = src.def_line(m.group("file"), int(m.group("line")), m.group("func"))
                keys[node[3]] = (f"{src.show(m.group('file'))}:{line}", m.group("func"))
        hit = keys[node[3]]
        if hit is None:
            continue
        key, func = hit
        sp = spans[node[0]]
        self_ns = max(0, sp[1] - sp[0] - child.get(node[0], 0))
        a = agg.setdefault(key, [func, 0, 0, False])
        a[1] += 1
        a[2] += self_ns
        a[3] = a[3] or in_data[node[0]]
    rows = [{"def": k, "func": v[0], "calls": round(v[1] / n, 2), "self_ms": _ms(v[2] / n),
             **({"in_data": True} if v[3] else {})} for k, v in agg.items()]
    rows.sort(key=lambda r: -r["self_ms"])
    return {"functions": rows[:TOP_N], "user_self_ms": _ms(sum(v[2] for v in agg.values()) / n)}


def analyze(flat: dict[str, Any], src: Sources, flags: dict[str, Any] | None = None,
            world: int = 1) -> dict[str, dict]:
    """Every payload of one window, keyed by evidence kind. Device payloads only with GPU data;
    the collectives table only on a rank of a ranked run (``world`` > 1)."""
    w = Window(flat)
    flags = flags or {}
    out: dict[str, dict] = {"profile_window": window_summary(w)}
    if not w.steps:
        return out
    out["profile_ops"] = top_ops(w)
    out["profile_host"] = host(w, src)
    out["profile_python"] = python_hotspots(w, src)
    if w.device:
        out["profile_device"] = device_time(w)
        out["profile_kernels"] = top_kernels(w)
        out["profile_gemm"] = gemm(w, src, flags)
        from torchdoctor.instruments.profile._profile_gemm import gemm_shapes

        out["profile_gemm_shapes"] = gemm_shapes(w, src)
        out["profile_copies"] = copies(w, src)
    if flat.get("device") or flat.get("runtime"):
        out["profile_syncs"] = syncs(w, src)
    if world > 1:
        from torchdoctor.instruments.profile._profile_comms import collectives

        table = collectives(w, world, device=bool(w.device))
        if table:
            out["profile_collectives"] = table
    return out
