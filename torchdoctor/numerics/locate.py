"""Where the first non-finite value of a window started (the monitor's localization).

Used by ``instruments/nan/nan_monitor.py`` only when a row read back non-finite (rarely): these
functions may synchronise the device. Inputs are the monitor's window (records in execution
order) and row: per (dtype, device), an (n, k) tensor of each reduced record's statistics with
the records' seqs (k = 2: [min, max]; k = 1: [max |x|], the fused CUDA reduction), and the
gradients and their norms.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Callable

from torchdoctor.torch_internals import dtensor_layout, local_tensor

MAX_BAD_PARAMS = 10
MAX_BAD_RECORDS = 4096


def norm_vals_overflow(norms: list) -> bool:
    """True when a per-gradient norm is +Inf (a float32 norm of finite values can overflow)."""
    return any(v == math.inf for v in norms)


def num(x: Any) -> Any:
    """JSON-safe float: NaN/Inf as the strings "nan" / "inf" / "-inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


class Locator:
    """``forward`` / ``loss`` / ``grads`` return the ``nonfinite`` event's data, or None.

    ``benign``: ids of modules seen making -Inf that never reached the loss (masks; the
    monitor fills it); ``emit``: the context's ``emit`` (for ``grad_norm_overflow``).
    """

    def __init__(self, torch: Any, benign: set[int], emit: Callable[..., None]):
        self.torch = torch
        self.benign = benign
        self.emit = emit

    def bad_records(self, r: Any) -> list[tuple[int, bool]]:
        """(seq, weak) of the window's non-finite records in execution order; ``weak``: the
        record holds Inf but no NaN and, where its sign is known ([min, max]), no +Inf (the
        -Inf of a mask)."""
        torch = self.torch
        out: list[tuple[int, bool]] = []
        for s, seqs in r.stacks.values():
            mm = s if s.dtype == torch.float64 else s.float()  # float64: no overflow to Inf
            bad = ~torch.isfinite(mm).all(dim=1)
            if mm.shape[1] == 2:
                weak = (mm[:, 0] == float("-inf")) & torch.isfinite(mm[:, 1])
            else:
                weak = torch.isinf(mm[:, 0])
            idx = bad.nonzero().flatten()[:MAX_BAD_RECORDS]
            if idx.numel():
                for i, w in zip(idx.tolist(), weak[idx].tolist()):
                    out.append((seqs[i], bool(w)))
        out.sort()
        return out

    def first_bad_seq(self, r: Any) -> int | None:
        """The first non-finite record, skipping Inf-only outputs of modules seen making Inf
        at earlier steps whose loss stayed finite (masks), and Inf-only inputs after one."""
        w = r.win
        first_benign = None
        for seq, weak in self.bad_records(r):
            rec = w.recs[seq]
            if weak and ((rec[0] == "out" and id(rec[1]) in self.benign)
                         or (rec[0] == "in" and first_benign is not None)):
                first_benign = first_benign if first_benign is not None else seq
                continue
            r.neg_inf_before = first_benign
            return seq
        return first_benign

    def stat(self, r: Any, seq: int) -> dict[str, Any]:
        """What was measured for record ``seq`` (following aliases): {"minmax": [min, max]} or
        {"absmax": max |x|}; {"minmax": None} when the record was not reduced (its tensor was
        modified in place before the window was reduced)."""
        w = r.win
        rec = w.recs[seq]
        if rec[5] >= 0:
            seq = rec[5]
        for s, seqs in r.stacks.values():
            i = bisect.bisect_left(seqs, seq)  # seqs are in execution order: binary search
            if i < len(seqs) and seqs[i] == seq:
                vals = [num(float(f"{x:.6g}")) for x in s[i].tolist()]
                return {"minmax": vals} if len(vals) == 2 else {"absmax": vals[0]}
        return {"minmax": None}

    def call_info(self, r: Any, cid: int, namer) -> dict[str, Any]:
        from torchdoctor.numerics.names import forward_source, is_user_module

        w = r.win
        m = w.calls[cid]
        ordinal = sum(1 for j in range(cid) if w.calls[j] is m)
        root_cls, rel = namer.rel.get(id(m), (type(m).__name__, None))
        info = {"module": namer.module(m), "module_class": type(m).__name__,
                "call": ordinal, "target": {"root_class": root_cls, "path": rel,
                                            "module_class": type(m).__name__, "ordinal": ordinal},
                "grad_enabled": w.grad_on[cid], "training": bool(getattr(m, "training", True))}
        src = forward_source(m)
        if src:
            info["forward_source"] = src
            info["user_code"] = is_user_module(m)
        return info

    def io(self, r: Any, cid: int, role: str) -> list:
        w = r.win
        return [{"index": rec[4], **self.stat(r, seq)}
                for seq, rec in enumerate(w.recs) if rec[2] == cid and rec[0] == role][:4]

    def params_state(self, m: Any, namer) -> list[str]:
        """Names of ``m``'s own parameters/buffers that hold NaN/Inf (weights already broken)."""
        torch = self.torch
        bad = []
        with torch.no_grad():
            for n, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
                p = local_tensor(p)  # a DTensor: this rank's shard (no collective)
                if ((p.is_floating_point() or p.is_complex()) and p.numel()
                        and not bool(torch.isfinite(p).all())):
                    bad.append(f"{namer.module(m)}.{n}")
        return bad

    def forward(self, r: Any, namer) -> dict[str, Any] | None:
        w = r.win
        seq = self.first_bad_seq(r)
        if seq is None:
            return None
        role, m, cid, step0, idx, _alias = w.recs[seq]
        ev: dict[str, Any] = {"step": step0 + 1, "record": seq, "records": len(w.recs)}
        if r.neg_inf_before is not None:
            rec = w.recs[r.neg_inf_before]
            sign = "-Inf" if "minmax" in self.stat(r, r.neg_inf_before) else "Inf (no NaN)"
            ev["earlier_neg_inf"] = (f"{namer.module(rec[1])} ({type(rec[1]).__name__}) "
                                     f"{'output' if rec[0] == 'out' else 'input'} held {sign} "
                                     f"before (a mask?)")
        if role == "out":
            ev["what"] = "forward"
            ev.update(self.call_info(r, cid, namer))
            ev["output_index"] = idx
            ev["outputs"] = self.io(r, cid, "out")
            ev["inputs"] = self.io(r, cid, "in")
            ev["nonfinite_params"] = self.params_state(m, namer)
            ev["parent"] = (namer.module(w.calls[w.parents[cid]]) if w.parents[cid] >= 0 else None)
            return ev
        # a module received a non-finite input while every earlier output was finite: the
        # caller's own code (between its child modules) made it, or the data did (root call)
        parent = w.parents[cid]
        ev["receiver"] = {"module": namer.module(m), "module_class": type(m).__name__,
                          "input_index": idx, **self.stat(r, seq)}
        src = w.inplace.get(seq)
        if src is not None:  # the same tensor was an earlier record, then modified in place
            srec = w.recs[src]
            ev["modified_in_place"] = {"module": namer.module(srec[1]),
                                       "module_class": type(srec[1]).__name__,
                                       "role": "output" if srec[0] == "out" else "input",
                                       **self.stat(r, src)}
        if parent < 0:
            ev["what"] = "input"
            ev.update(self.call_info(r, cid, namer))
            ev["inputs"] = self.io(r, cid, "in")
            return ev
        ev["what"] = "forward"
        ev["between_children"] = True
        ev.update(self.call_info(r, parent, namer))
        ev["inputs"] = self.io(r, parent, "in")
        ev["nonfinite_params"] = self.params_state(w.calls[parent], namer)
        return ev

    def loss(self, r: Any, namer) -> dict[str, Any] | None:
        w = r.win
        if r.loss_vec is None:
            return None
        vals = [num(x) for x in r.loss_vec.reshape(-1).tolist()]
        ev: dict[str, Any] = {"what": "loss", "loss": vals[:8]}
        first = None
        pos = 0
        for info in w.loss_info:
            n = 1 if info.scalar else 2
            if any(not isinstance(v, float) for v in vals[pos:pos + n]):
                first = info.as_dict()
                break
            pos += n
        if first is not None:
            ev["step"] = first["step"]
            ev["loss_shape"] = first["shape"]
            ev["loss_dtype"] = first["dtype"]
        if w.root_outs:
            seq = w.root_outs[-1]
            rec = w.recs[seq]
            ev["model_output"] = {"module": namer.module(rec[1]), "module_class": type(rec[1]).__name__,
                                  **self.stat(r, seq)}
        return ev

    def grads(self, r: Any, namer) -> dict[str, Any] | None:
        torch = self.torch
        if r.norms is None:
            return None
        # per-parameter norms: a list of floats (CPU rows) or a device tensor (CUDA rows)
        norm_vals = r.norms if isinstance(r.norms, list) else r.norms.tolist()
        bad_idx = [i for i, v in enumerate(norm_vals) if not math.isfinite(v)]
        params = r.params
        confirmed = None
        # DTensor gradients (FSDP2, tensor parallel): this rank's shard only; a reduction of
        # the DTensor itself would be a collective that only this rank enters
        if r.live:  # the gradients are still the ones measured: confirm exactly
            with torch.no_grad():
                exact = [i for i in bad_idx
                         if not bool(torch.isfinite(local_tensor(params[i].grad)).all())]
            confirmed = True
            bad_idx = exact
        if not bad_idx and getattr(r, "sharded", False) and not norm_vals_overflow(norm_vals):
            r.elsewhere = True  # every local shard is finite: the bad value is on another rank
            return None
        if not bad_idx:  # finite gradients whose float32 norm overflowed: an explosion, not NaN
            if r.live:
                with torch.no_grad():
                    from torchdoctor.numerics.tensors import grad_norms

                    n64 = grad_norms([local_tensor(p.grad) for p in params], wide=True)
                    r.gnorm64 = float(torch.linalg.vector_norm(torch.stack([n.cpu() for n in n64])))
            self.emit("grad_norm_overflow", step=r.step, norm=r.gnorm64)
            return None
        order = r.win.order if r.win is not None else {}

        def key(i: int) -> tuple:
            owner = namer.owner(params[i])
            return (order.get(id(owner), -1) if owner is not None else -1, i)

        first = max(bad_idx, key=key)
        p = params[first]
        ev: dict[str, Any] = {"what": "gradient", "param": namer.param(p, f"param {first}"),
                              "param_shape": list(p.shape),
                              "param_dtype": str(p.dtype).replace("torch.", ""),
                              "grad_norm": num(norm_vals[first]),
                              "bad_params": [namer.param(params[i], f"param {i}")
                                             for i in sorted(bad_idx, key=key, reverse=True)[:MAX_BAD_PARAMS]],
                              "bad_count": len(bad_idx), "params_with_grad": len(params),
                              "order": "backward" if order else "optimizer",
                              "confirmed": bool(confirmed)}
        owner = namer.owner(p)
        if owner is not None:
            ev["module"] = namer.module(owner)
            ev["module_class"] = type(owner).__name__
            from torchdoctor.numerics.names import forward_source

            src = forward_source(owner)
            if src:
                ev["forward_source"] = src
        layout = dtensor_layout(p)
        if layout is not None:
            ev["shard"] = layout  # the stats below are of this rank's shard
        if r.live:
            from torchdoctor.numerics.tensors import exact_stats

            ev["grad_stats"] = exact_stats(local_tensor(p.grad))
            with torch.no_grad():
                ev["param_finite"] = bool(torch.isfinite(local_tensor(p)).all())
        return ev
