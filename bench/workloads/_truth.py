"""The workload side of the GPU truth harness (``bench/gpu_truth.py``): each reference workload
times itself the way a careful user would, so that torchdoctor's printed numbers can be checked
against it in the same process.

* **Step time**: one ``torch.cuda.synchronize()`` at the start and at the end of the timed window
  (after ``--warmup`` steps), none inside it: window wall / timed steps is exact.
* **Phase times**: CUDA events recorded around forward (the model call: the loss computed
  outside the model is not forward, as for torchdoctor, whose forward is the root module's),
  backward and optimizer (no sync; read once at the end): device time per phase, mean per step.
* **Memory**: ``torch.cuda.memory_allocated()`` at every step end (an allocator counter read,
  no sync) and ``max_memory_allocated()`` over the run.

On a CPU (``--device cpu``, for smoke tests of the harness) the same keys come from host clocks.
Writes one JSON object to ``--result``.
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager


def parser(**defaults) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=defaults.get("steps", 20))
    p.add_argument("--warmup", type=int, default=defaults.get("warmup", 8))
    p.add_argument("--device", default="cuda")
    p.add_argument("--result", default=None)
    return p


class Clock:
    PHASES = ("forward", "backward", "optimizer")

    def __init__(self, args, torch):
        self.a, self.torch = args, torch
        self.cuda = str(args.device).startswith("cuda")
        self.i = 0  # steps done
        self.t0 = None
        self.ev: dict[str, list] = {p: [] for p in self.PHASES}
        self.host: dict[str, float] = {p: 0.0 for p in self.PHASES}
        self.mem: list[int] = []
        self.last_loss = None

    @property
    def total(self) -> int:
        return self.a.warmup + self.a.steps

    def timed(self) -> bool:
        return self.i >= self.a.warmup

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    @contextmanager
    def phase(self, name: str):
        if not self.timed():
            yield
            return
        if self.cuda:
            b = self.torch.cuda.Event(enable_timing=True)
            e = self.torch.cuda.Event(enable_timing=True)
            b.record()
            yield
            e.record()
            self.ev[name].append((b, e))
        else:
            t = time.perf_counter()
            yield
            self.host[name] += time.perf_counter() - t

    def begin(self):
        """Call at the top of every step."""
        if self.i == self.a.warmup:
            self._sync()
            self.t0 = time.perf_counter()

    def update(self, loss, opt) -> None:
        """The rest of a plain step: zero_grad, backward, optimizer step (each phase timed), end."""
        opt.zero_grad(set_to_none=True)
        with self.phase("backward"):
            loss.backward()
        with self.phase("optimizer"):
            opt.step()
        self.end(loss)

    def end(self, loss=None):
        """Call at the bottom of every step (after optimizer.step())."""
        if loss is not None:  # only the last one: a loss may be a view of a large buffer
            self.last_loss = loss.detach()
        if self.cuda:
            self.mem.append(int(self.torch.cuda.memory_allocated()))
        self.i += 1

    def done(self) -> bool:
        return self.i >= self.total

    def finish(self, **extra) -> dict:
        self._sync()
        wall = time.perf_counter() - self.t0
        n = self.a.steps
        out = {"step_ms": wall / n * 1e3, "steps": n, "warmup": self.a.warmup,
               "device": "cuda" if self.cuda else "cpu"}
        if self.cuda:
            out["phase_ms"] = {p: sum(b.elapsed_time(e) for b, e in self.ev[p]) / n
                               for p in self.PHASES}
            out["max_memory_allocated"] = int(self.torch.cuda.max_memory_allocated())
            out["memory_at_step_end"] = self.mem
            out["device_name"] = self.torch.cuda.get_device_name()
        else:
            out["phase_ms"] = {p: self.host[p] / n * 1e3 for p in self.PHASES}
        if self.last_loss is not None:
            out["last_loss"] = float(self.last_loss)
        out.update(extra)
        if self.a.result:
            with open(self.a.result, "w") as f:
                json.dump(out, f)
        return out
