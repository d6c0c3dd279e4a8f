"""Which DataLoader the data wait came from: the loader that fed the training steps.

A script iterates several loaders (training, validation every N steps, a one-batch peek); the
step clock sums every batch's wait into the step it falls in. This instrument splits that wait
per *loader* so ``dataloader-bound`` can name the loader whose batches fed the steps, not the
last one iterated:

* ``DataLoader.__init__`` is wrapped to note the user's line that built each loader;
* ``_BaseDataLoaderIter.__init__`` (every iterator receives its loader) to map the iterator to
  its loader's number;
* ``_BaseDataLoaderIter.__next__`` (around the step clock's own wrapper) to tell the step
  clock's ``on_batch`` callback which loader the batch came from.

Nothing is stored on the user's loaders or iterators (id-keyed dicts with weak references).

Events: ``data_loader`` {loader, created_at, loop, dataset, getitem, num_workers, pin_memory,
batch_size} once per loader (``loop``: the user's line that took its first batch);
``data_step`` {step, wait_s: {loader: s}, batches: {loader: n}, fed} per step that drew a
batch (``fed``: the loader of the step's last batch, the one its backward used; ``starts``: the
loaders whose iterator was created in the step, i.e. an epoch began there). Cost: two
dict look-ups per batch, one event per step.
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register


@register
class DataSource(Instrument):
    name = "data_source"
    produces = frozenset({"data_loader", "data_step"})
    priority = 14

    def install(self, ctx: Any) -> None:
        from torch.utils.data import dataloader as dl_mod

        from torchdoctor.instruments._sites import SiteBook, creation_site

        self.ctx = ctx
        self.pid = os.getpid()
        self.loaders = SiteBook()  # loader -> [index, created_at, described]
        self.iters = SiteBook()  # iterator -> loader index
        self.cur: int | None = None
        self.wait: dict[int, float] = {}
        self.batches: dict[int, int] = {}
        self.fed: int | None = None
        self.started: set[int] = set()  # loaders whose iterator (an epoch) began in this step
        from torchdoctor.runner.patching import Patches
        from torchdoctor.torch_internals import base_loader_iter

        self._patches = Patches()
        inst = self
        DL, It = dl_mod.DataLoader, base_loader_iter()
        orig_dl_init, orig_it_init, orig_next = DL.__init__, It.__init__, It.__next__

        def dl_init(loader, *a, **k):
            orig_dl_init(loader, *a, **k)
            if inst.live and os.getpid() == inst.pid and inst.loaders.get(loader) is None:
                try:
                    inst.loaders.put(loader, [len(inst.loaders), creation_site(loader, 2), False])
                except Exception:  # noqa: BLE001 - never break the user's script
                    pass

        def it_init(it, loader, *a, **k):
            orig_it_init(it, loader, *a, **k)
            if inst.live and os.getpid() == inst.pid:
                try:
                    rec = inst.loaders.get(loader)
                    if rec is None:  # built before install, or __init__ bypassed
                        rec = [len(inst.loaders), None, False]
                        inst.loaders.put(loader, rec)
                    inst.iters.put(it, rec)
                    inst.started.add(rec[0])
                except Exception:  # noqa: BLE001
                    pass

        def it_next(it):
            if inst.live:
                inst.cur = it
            return orig_next(it)

        for owner, attr, f, o in ((DL, "__init__", dl_init, orig_dl_init), (It, "__init__", it_init, orig_it_init),
                                  (It, "__next__", it_next, orig_next)):
            self._patches.set(owner, attr, f, o)

    live = True

    def on_batch(self, ctx: Any, wait_s: float) -> None:
        it, self.cur = self.cur, None
        rec = self.iters.get(it) if it is not None else None
        if rec is None:
            return
        idx = rec[0]
        self.wait[idx] = self.wait.get(idx, 0.0) + wait_s
        self.batches[idx] = self.batches.get(idx, 0) + 1
        self.fed = idx
        if not rec[2]:
            rec[2] = True
            from torchdoctor.runner.loaders import loader_facts

            ctx.emit("data_loader", loader=idx, created_at=rec[1], **loader_facts(it))

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.batches:
            return
        extra = {"starts": sorted(str(k) for k in self.started)} if self.started else {}
        ctx.emit("data_step", step=step, wait_s={str(k): round(v, 7) for k, v in self.wait.items()},
                 batches={str(k): v for k, v in self.batches.items()}, fed=self.fed, **extra)
        self.wait, self.batches, self.started = {}, {}, set()

    def uninstall(self, ctx: Any) -> None:
        self.live = False  # a wrapper re-wrapped by someone else stays, inert
        if getattr(self, "_patches", None) is not None:
            self._patches.undo()

