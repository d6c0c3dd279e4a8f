"""The rows of the non-finite monitor (mixed into
:class:`torchdoctor.instruments.nan.nan_monitor.NanMonitor`; see its module doc): each window
reduced on the device to a short row at the optimizer pre-step (:meth:`RowReader._close_row`),
rows read back without a device sync (:meth:`RowReader._read`), the ``numerics`` series, and
the location of the first non-finite value when a row is not finite
(:meth:`RowReader._localize`).
"""

from __future__ import annotations

import math
from typing import Any

from torchdoctor.instruments.nan._nan_window import EMIT_EVERY, LEARN_CONTAINED, MAX_PENDING, _Row, _Window
from torchdoctor.numerics.locate import num as _num
from torchdoctor.numerics.sharded import ShardedNorm
from torchdoctor.torch_internals import (dtensor_norm_share, fsdp1_shard_groups, is_dtensor,
                                         local_tensor)

class RowReader:
    """Mixin of the monitor: rows, their reading and the localisation."""

    def _close_row(self, opt: int | None, params: list, step: int) -> None:
        """Reduce the current window on the device into a short row; start a new window.

        The row holds, as present: ``fwd`` (0, or NaN when any watched tensor was non-finite:
        ``(stacked per-record statistics * 0).sum()``), ``lossflag`` (same for the losses), ``loss`` (the last
        scalar loss) and ``gnorm`` (global L2 norm of the gradients: NaN/Inf when one is).

        A row whose parts are all on the CPU is read at once into Python floats (a CPU read
        costs no sync; the global norm is then summed in float64, so it cannot overflow); a
        CUDA row stays a device tensor until :meth:`_read`.
        """
        torch = self.torch
        w = self.win
        self.win = _Window()
        self._flush(w)
        self.records += len(w.recs)
        self.modified += w.modified
        strided = torch.strided
        Tensor = self._Tensor
        gp = []
        grads = []
        shards = None  # ShardedNorm when some gradients are DTensors (FSDP2, tensor parallel)
        flat = self._flat_groups(opt, params)  # FSDP1: {id(param): shard group}
        if flat:
            shards = ShardedNorm()
            for p in params:  # every rank: the same groups, in the optimizer's order
                if id(p) in flat:
                    shards.group(flat[id(p)])
        for p in params:
            g = p.grad
            if g is None:
                continue
            share = None
            if type(g) is not Tensor and is_dtensor(g):
                share = (dtensor_norm_share(g), g.device_mesh)
                g = local_tensor(g)  # this rank's shard: no collective, no copy
            elif flat and id(p) in flat:
                share = ((flat[id(p)], 1.0), flat[id(p)])  # an FSDP1 shard of a flat parameter
            if g.layout == strided:
                if share is not None:
                    if shards is None:
                        shards = ShardedNorm()
                    shards.add(len(grads), *share)
                gp.append(p)
                grads.append(g)
        norms = loss_vec = None
        parts: list = []
        layout: list[str] = []
        stacks = {}
        grad_on, set_grad = self._grad_mode
        was_on = grad_on()
        if was_on:
            set_grad(False)  # nothing recorded for autograd (cheaper than a no_grad block)
        try:
            if grads:
                ns = self._grad_norms(grads)  # float32, float64 for float64 gradients
                dev = ns[0].device
                if dev.type == "cpu" and not self.async_test:
                    norms = [n.item() for n in ns]  # per-parameter norms, read at once
                else:
                    try:
                        norms = torch.stack(ns)
                    except RuntimeError:  # gradients on several devices
                        norms = torch.stack([n.to(dev) for n in ns])
            if shards:  # the full gradients' norm: shares summed over each mesh (a collective),
                # first, before anything this rank alone could fail on: every rank must enter it
                self.sharded_rows += 1
                self.partial_grads = max(self.partial_grads, len(shards.partial))
                total = (shards.total_cpu(torch, norms) if isinstance(norms, list)
                         else shards.total_dev(torch, norms))
            flags = []
            for (key, k), (vals, seqs) in w.reduced.items():
                st = torch.stack(vals).view(-1, k)  # one row of k statistics per record
                stacks[key, k] = (st, seqs)
                flags.append(st.mul(0).sum(dtype=torch.float32))
            if flags:
                dev0 = flags[0].device
                parts.append(flags[0] if len(flags) == 1 else
                             torch.stack([f.to(dev0) for f in flags]).sum())
                layout.append("fwd")
            if len(w.losses) == 1 and w.loss_info[0].scalar:
                loss_vec = w.losses[0]  # one scalar loss: its value is its own flag
                if loss_vec.dim():
                    loss_vec = loss_vec.reshape(())
                loss_vec = self._keep(loss_vec)
                parts.append(loss_vec)
                layout.append("loss")
            elif w.losses:
                dev0 = w.losses[0].device
                loss_vec = torch.cat([self._keep(v.reshape(-1)).to(dev0) for v in w.losses])
                parts.append(loss_vec.mul(0).sum())
                layout.append("lossflag")
                last = self._last_scalar(w)
                if last is not None:
                    parts.append(loss_vec[last])
                    layout.append("loss")
            if w.clip is not None and norms is not None:  # the norm clip_grad_norm_ returned: before clipping
                parts.append(self._keep(w.clip[0].detach().reshape(())))
                layout.append("pnorm")
            if norms is not None:
                layout.append("gnorm")
            if not layout:
                return
            on_cpu = all(not x.is_cuda for x in parts) and (norms is None or isinstance(norms, list))
            if on_cpu and not self.async_test:
                row: Any = [float(x) for x in parts]
                if norms is not None:
                    row.append(total if shards else math.hypot(*norms))  # float64, exact to an ulp
            else:
                if isinstance(norms, list):  # CPU gradients, a CUDA loss
                    parts.append(torch.tensor(total if shards else math.hypot(*norms), device="cpu"))
                elif norms is not None:
                    parts.append(total.float() if shards else torch.linalg.vector_norm(norms))
                dev = parts[-1].device
                row = torch.stack([x if x.device == dev else x.to(dev) for x in parts])
        finally:
            if was_on:
                set_grad(True)
        # the row keeps the window for the records' names, not its tensors: the last watched
        # output (the logits), the losses and the per-record values (``stacks`` holds them)
        # would otherwise live until the row is read, a step or more later on CUDA
        w.last_out = None
        w.losses = []
        w.reduced = {}
        for r in self.pending:
            r.live = False  # gradients / tensors of older rows may have changed since
        new = _Row(step, opt, row, w, gp, norms, stacks, loss_vec, layout)
        if "pnorm" in layout:
            new.clip_max = w.clip[1]
        new.sharded = shards is not None
        if not isinstance(row, list) and not self.sync_read and (row.is_cuda or self.async_test):
            if self.reader is None:
                from torchdoctor.numerics import hostread

                self.reader = (hostread.DeferredRowReader() if self.async_test
                               else hostread.CudaRowReader())
            new.handle = self.reader.submit(row)
        self.pending.append(new)
        self.rows += 1

    def _flat_groups(self, opt: int | None, params: list) -> dict[int, Any]:
        """FSDP1's {id(param): shard group} for the parameters of optimizer ``opt``, looked up
        once per optimizer (FSDP1 builds its flat parameters before the optimizer exists)."""
        if not params:
            return {}
        cache = self.__dict__.setdefault("_flat_cache", {})
        got = cache.get(opt)
        if got is None:
            models = self.ctx.models()
            groups = fsdp1_shard_groups(models)
            got = {id(p): groups[id(p)] for p in params if id(p) in groups}
            if models and opt is not None:  # (no-optimizer rows: the models' parameters may change)
                cache[opt] = got
        return got

    def _maybe_read(self) -> None:
        """CPU rows: read every ``check_every`` rows (a CPU read costs no sync). CUDA rows:
        read those whose copy has landed (no sync); wait only when too many are in flight."""
        if not self.pending:
            return
        if self.pending[-1].handle is None:
            if len(self.pending) >= self.every:
                self._read()
        elif self._lockstep():
            # several ranks: when a device row is read must not depend on this rank's GPU
            # timing (``Event.query``), or one rank stops on a verdict while its peers, whose
            # copy had not landed yet, enter the next step's collectives alone (a hang). Every
            # row but the newest is read now, waiting if need be: row N at row N+1's close, the
            # same optimizer pre-step on every rank. Waiting for a row a step old costs ~nothing.
            self._read(keep=1)
        else:
            self._read(block=len(self.pending) > MAX_PENDING)

    def _lockstep(self) -> bool:
        """True once this process is one rank of several (a default process group of world
        size > 1): device rows are then read at a point the ranks share (:meth:`_maybe_read`)."""
        if self.__dict__.get("_lockstep_on"):
            return True
        dist = getattr(self.torch, "distributed", None)
        on = bool(dist is not None and dist.is_available() and dist.is_initialized()
                  and dist.get_world_size() > 1)
        if on:
            self._lockstep_on = True  # (destroy_process_group at the end: the rows stay in step)
        return on

    def _keep(self, v: Any) -> Any:
        """``v`` in float32, or float64 when it is float64: a finite float64 loss above
        float32's range must not read back as Inf."""
        return v if v.dtype in self._wide else v.float()

    @staticmethod
    def _last_scalar(w: _Window) -> int | None:
        """Index of the last scalar loss in the concatenated loss vector."""
        pos = 0
        last = None
        for info in w.loss_info:
            if info.scalar:
                last = pos
            pos += 1 if info.scalar else 2
        return last

    def _read(self, block: bool = True, keep: int = 0) -> None:
        """Read pending rows in order (all of them but the ``keep`` newest, or with
        ``block=False`` only those already on the host); localize the first non-finite one."""
        if len(self.pending) <= keep:
            return
        torch = self.torch
        rows: list[_Row] = []
        while len(self.pending) > keep:
            r = self.pending[0]
            if not block and r.handle is not None and not self.reader.ready(r.handle):
                break
            rows.append(self.pending.pop(0))
        if not rows:
            return
        self.reads += 1
        flat: list[float] = []
        cpu = [r.row for r in rows if r.handle is None and not isinstance(r.row, list)]
        cpu_vals = torch.cat([x.to(cpu[-1].device) for x in cpu]).tolist() if cpu else []
        for r in rows:
            if isinstance(r.row, list):  # a CPU row, read when it was made
                flat += r.row
            elif r.handle is None:
                n = len(r.layout)
                flat += cpu_vals[:n]
                cpu_vals = cpu_vals[n:]
            else:
                flat += self.reader.values(r.handle)
        steps, opts, losses, norms = [], [], [], []
        pos = 0
        for r in rows:
            vals = dict(zip(r.layout, flat[pos:pos + len(r.layout)]))
            pos += len(r.layout)
            steps.append(r.step)
            opts.append(r.opt)
            losses.append(_num(vals["loss"]) if "loss" in vals else None)
            norms.append(_num(vals["gnorm"]) if "gnorm" in vals else None)
            self.clip_series[0].append(_num(vals["pnorm"]) if "pnorm" in vals else None)
            self.clip_series[1].append(r.clip_max)
            fwd_ok = math.isfinite(vals.get("fwd", 0.0))
            loss_ok = math.isfinite(vals.get("lossflag", vals.get("loss", 0.0)))
            grads_ok = math.isfinite(vals.get("gnorm", 0.0))
            if self.found or (fwd_ok and loss_ok and grads_ok):
                continue
            if not fwd_ok and loss_ok and grads_ok and ("loss" in vals or "lossflag" in vals
                                                        or "gnorm" in vals):
                # non-finite values inside the forward that never reached the loss or the
                # gradients (masks filled with -inf, values a torch.where discards): by design
                self.contained += 1
                if self.contained <= LEARN_CONTAINED:
                    self._learn_benign(r)
                continue
            try:
                self._localize(r, fwd_ok, loss_ok, grads_ok)
            finally:
                r.win = None
            if r.gnorm64 is not None:
                norms[-1] = r.gnorm64
        se = self.series
        for lst, new in zip(se, (steps, opts, losses, norms)):
            lst.extend(new)
        if len(se[0]) >= EMIT_EVERY or self.found:
            self._emit_series()

    def _emit_series(self) -> None:
        se, cs = self.series, self.clip_series
        if se[0]:
            extra = {}
            if any(m is not None for m in cs[1]):  # clipping seen: the norm before it and max_norm
                extra = {"grad_norm_pre_clip": cs[0], "clip_max": cs[1]}
            self.ctx.emit("numerics", steps=se[0], opt=se[1], loss=se[2], grad_norm=se[3], **extra)
        self.series = ([], [], [], [])
        self.clip_series = ([], [])

    # ------------------------------------------------------------------ localization
    def _localize(self, r: _Row, fwd_ok: bool, loss_ok: bool, grads_ok: bool) -> None:
        from torchdoctor.numerics.names import Namer

        ctx = self.ctx
        namer = Namer(ctx.models())
        w = r.win
        ev: dict[str, Any] | None = None
        if not fwd_ok:
            ev = self.locator.forward(r, namer)
        if ev is None and not loss_ok:
            ev = self.locator.loss(r, namer)
        if ev is None and not grads_ok:
            ev = self.locator.grads(r, namer)
        if ev is None:
            if r.elsewhere:
                # every local shard finite, the mesh-wide norm not: another rank holds the bad
                # value (and names it); this rank stops at the same row as that one
                self.found = True
                ctx.emit("nonfinite_elsewhere", step=r.step, optimizer=r.opt,
                         params_with_grad=len(r.params))
                if self.stop_on_bad:
                    ctx.request_stop(f"a non-finite gradient on another rank at step {r.step}")
            return
        ev.setdefault("step", r.step)
        ev["forward_watch"] = self.watch
        ev["optimizer"] = r.opt
        if w is not None:
            ev["losses"] = [i.as_dict() for i in w.loss_info[:4]]
        self.found = True
        ctx.emit("nonfinite", **ev)
        if self.stop_on_bad:
            ctx.request_stop(f"first non-finite value found at step {ev['step']}")

    def _learn_benign(self, r: _Row) -> None:
        """Modules whose -Inf outputs never reached the loss (masks) are benign later on."""
        w = r.win
        if w is None:
            return
        for seq, weak in self.locator.bad_records(r):
            rec = w.recs[seq]
            if weak and rec[0] == "out":
                self.benign.add(id(rec[1]))
        if self.contained == 1:
            from torchdoctor.numerics.names import Namer

            namer = Namer(self.ctx.models())
            self.ctx.emit("nonfinite_contained", step=r.step,
                          modules=[namer.module(m) for m in {id(x): x for x in w.calls}.values()
                                   if id(m) in self.benign][:8])
