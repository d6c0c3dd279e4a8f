"""Optimizer steps as step boundaries, and the cycle of several optimizers (part of
:class:`torchdoctor.runner.core.Core`).

Several optimizers (a GAN's generator and discriminator, WGAN's critic stepping five times per
generator step, an encoder/decoder pair): a training step is one iteration of the outer loop,
i.e. one period of the cycle of optimizer steps. While the cycle is unknown (more than one
optimizer was built by the clock's thread), no boundary is made; the steps are remembered
with the clock's counters at each. The cycle is known when the first optimizer that stepped
steps again after every optimizer built has stepped; its last optimizer (the one that
stepped just before the first came back) closes every iteration from then on, and the
iterations already run are cut at its remembered steps. An optimizer stepping more than
``LEARN_REPEATS`` times ends the learning all the same (an optimizer built and never used;
the first optimizer never stepping again: then that optimizer closes the iterations). An
optimizer that first steps later (a phase that adds one, an optimizer re-created each epoch)
closes the iterations from then on.
"""

from __future__ import annotations

import os
import threading
import time

_perf = time.perf_counter
_get_ident = threading.get_ident
# several optimizers: the first optimizer coming back this often with some built optimizer
# still never stepped ends the learning of the cycle all the same (an optimizer built, unused)
LEARN_REPEATS = 8
LEARN_MAX = 4096  # optimizer steps remembered while the cycle is learned


class OptimizerCycle:
    """Mixin of the core: the optimizer step pre/post hooks and the cycle learning."""

    def _opt_pre(self, opt, args, kwargs):
        if os.getpid() != self.ctx._owner_pid or not self._here(training=True):
            return None
        now = _perf()
        if self.t_start is None:
            self.t_start = now
        self.ctx.phase = "optimizer"
        self.t_phase = now
        if self.cuda is not None:
            self.cuda.mark("optimizer", 0)
        return None

    def _opt_post(self, opt, args, kwargs):
        if os.getpid() != self.ctx._owner_pid:
            return None
        if not self._here(training=True) and not (self.ctx._train_tid is None and self._fix_clock()):
            return None
        if self.ctx._train_tid is None:
            self._fix_clock()  # the main thread's first step
        if self.ctx.phase == "optimizer":  # (a thread just adopted: its pre hook was not seen)
            self.opt_s += _perf() - self.t_phase
        self.ctx.phase = "other"
        if self.cuda is not None:
            self.cuda.mark("optimizer", 1)
        self.ctx._add_optimizer(opt)
        self.source = "optimizer"
        oid = id(opt)
        if self.closing_opt is None:
            self._learn(oid)
        elif oid == self.closing_opt or oid not in self.opt_seen:
            # a new optimizer (a phase that adds one, one re-created per epoch) closes from now on
            self.closing_opt = oid
            self.opt_seen.add(oid)
            self._boundary()
        return None

    def _learn(self, oid: int) -> None:
        """The cycle of optimizer steps, while it is unknown (module doc)."""
        seq = self.learn_seq
        built = self.built_by.get(_get_ident(), 0)
        if not seq and built <= 1:  # one optimizer: each of its steps ends an iteration
            self.closing_opt = oid
            self.opt_seen.add(oid)
            self._boundary()
            return
        counts = self.learn_counts
        counts[oid] = counts.get(oid, 0) + 1
        first = seq[0][0] if seq else oid
        if seq and ((oid == first and len(counts) >= built) or counts[oid] > LEARN_REPEATS
                    or len(seq) >= LEARN_MAX):
            # known: the first optimizer came back after every built one stepped; or one came
            # back LEARN_REPEATS times (an optimizer built, unused; the first never again)
            last = seq[-1][0] if oid == first else oid  # the one that ends an iteration
            self.closing_opt = last
            self.opt_seen |= set(counts)
            self.learn_seq = []
            self.learn_counts = {}
            done = (0.0, 0.0, 0.0, 0.0, 0, 0)  # counters given to earlier cut steps
            for o, (t, *counters) in seq:  # the iterations already run, cut where they ended
                if o == last:
                    self._boundary(at=(t, *(c - d for c, d in zip(counters, done))))
                    done = tuple(counters)
            if oid == last:
                self._boundary()
            return
        seq.append((oid, (_perf(), self.data_s, self.fwd_s, self.bwd_s, self.opt_s,
                          self.batches, self.backwards)))
