"""RNG draws: which global random generators the script drew from, where, and their states.

Armed by ``repro`` (need ``rng_trace``). Measures, per run, what the parent compares between two
runs to say which generator produced different values:

* **draw counters** on the module-level functions of Python's ``random`` (``random.shuffle``,
  ``random.random`` …: the hidden global ``Random``) and of NumPy's legacy global generator
  (``numpy.random.rand``, ``numpy.random.shuffle`` …): a counter per generator and the user's
  file:line of the first draws (``MAX_SITES`` sites; the frame is looked up for the first
  ``SITE_CALLS`` draws only, then the wrapper just counts). The wrapper is an object that calls
  the original and pickles as the original (``__reduce_ex__``). Draws in forked DataLoader
  workers are not counted (each worker is seeded by torch);
* ``numpy.random.default_rng()`` called **without** a seed: the sites (a fresh generator from OS
  entropy; its draws are not counted);
* **state digests** of each global generator at start-up and at every step boundary: Python
  (``random.getstate``), NumPy legacy (``numpy.random.get_state``), torch CPU
  (``torch.random.default_generator.get_state``) and, once CUDA is initialised, each CUDA
  device's default generator (seed and offset: host-side, no sync); a 16-hex-digit BLAKE2b of
  the state;
* **DataLoader worker seeds**: the base seed of each multi-process iterator (drawn from the
  loader's generator or torch's global one; worker ``i`` seeds ``random``, torch and NumPy from
  ``base_seed + i``).

Nothing is drawn and no state is set: reading a state leaves it as it was. Idle in the localising
re-run (option ``repro_ops``). Event at the end: ``rng_trace`` {steps, states: {gen: [digest per
step]}, start: {gen: digest}, draws: {gen: n}, draws_by_step: {gen: [cumulative]}, sites: {gen:
[{where, fn, count}]}, unseeded_generators: [{where, count}], loaders: [{base_seed, num_workers,
where}]}. Cost: a counter per draw (and a frame walk for the first draws), four state digests
per step (~100 µs on CPU).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from array import array
from typing import Any

from torchdoctor.instruments.base import Instrument, register

RANDOM_FNS = ("random", "uniform", "triangular", "randint", "choice", "randrange", "sample",
              "shuffle", "choices", "normalvariate", "lognormvariate", "expovariate",
              "vonmisesvariate", "gammavariate", "gauss", "betavariate", "paretovariate",
              "weibullvariate", "getrandbits", "randbytes", "binomialvariate")
NUMPY_FNS = ("rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice",
             "shuffle", "permutation", "normal", "uniform", "standard_normal", "beta", "binomial",
             "poisson", "exponential", "gamma", "bytes", "random_integers", "multinomial",
             "dirichlet", "laplace", "lognormal", "multivariate_normal", "geometric",
             "hypergeometric", "logistic", "chisquare", "standard_cauchy", "standard_exponential",
             "standard_gamma", "standard_t", "triangular", "vonmises", "wald", "weibull", "zipf",
             "pareto", "power", "rayleigh", "gumbel", "f", "noncentral_chisquare", "noncentral_f",
             "negative_binomial", "logseries")
GENERATORS = ("python", "numpy", "torch", "cuda")
MAX_SITES = 8
SITE_CALLS = 2000
MAX_STEPS = 100_000
MAX_LOADERS = 16


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class Counted:
    """A global draw function that counts its calls; pickles and copies as the original."""

    __slots__ = ("__wrapped__", "_gen", "_fn", "_inst", "_td_patch")

    def __init__(self, orig: Any, gen: str, fn: str, inst: "RngDraws"):
        self.__wrapped__ = orig
        self._gen, self._fn, self._inst = gen, fn, inst

    def __call__(self, *a: Any, **k: Any) -> Any:
        inst = self._inst
        if inst.live and os.getpid() == inst.pid:
            inst.drew(self._gen, self._fn)
        return self.__wrapped__(*a, **k)

    def __reduce_ex__(self, protocol: int) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)

    def __getattr__(self, name: str) -> Any:  # __doc__, __name__, __self__ … of the original
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


@register
class RngDraws(Instrument):
    name = "rng_draws"
    produces = frozenset({"rng_trace"})
    priority = 87

    def install(self, ctx: Any) -> None:
        self.live = not ctx.options.get("repro_ops")
        if not self.live:
            return
        import torch

        from torchdoctor.runner.patching import Patches
        from torchdoctor.torch_internals import base_loader_iter

        self.torch, self.ctx = torch, ctx
        self.pid = os.getpid()
        self.np = sys.modules.get("numpy")
        self.counts = {g: 0 for g in GENERATORS}
        self.sites: dict[str, dict[str, list]] = {g: {} for g in GENERATORS}
        self.fresh: dict[str, int] = {}  # unseeded default_rng() sites
        self.loaders: list[dict[str, Any]] = []
        self.steps: list[int] = []
        self.states: dict[str, list[str | None]] = {g: [] for g in GENERATORS}
        self.by_step: dict[str, list[int]] = {g: [] for g in GENERATORS}
        self.start = self._states()
        self._patches = Patches()
        for fn in RANDOM_FNS:
            self._patches.wrap(random, fn, lambda o, fn=fn: Counted(o, "python", f"random.{fn}", self),
                               tag="rng-draws", require=False)
        if self.np is not None:
            npr = self.np.random
            for fn in NUMPY_FNS:
                self._patches.wrap(npr, fn, lambda o, fn=fn: Counted(o, "numpy", f"numpy.random.{fn}", self),
                                   tag="rng-draws", require=False)
            self._patches.wrap(npr, "default_rng", self._make_default_rng, tag="rng-draws",
                               require=False)
        self._patches.wrap(base_loader_iter(), "__init__", self._make_iter_init, tag="rng-draws")

    # ------------------------------------------------------------------ draws
    def drew(self, gen: str, fn: str) -> None:
        n = self.counts[gen] = self.counts[gen] + 1
        if n <= SITE_CALLS:
            self._site(self.sites[gen], fn)

    def _site(self, sites: dict, fn: str) -> None:
        from torchdoctor.runner.frames import short_path, user_frame

        uf = user_frame(4)
        where = short_path(f"{uf[0]}:{uf[1]}") if uf else "?"
        row = sites.get(where)
        if row is not None:
            row[1] += 1
        elif len(sites) < MAX_SITES:
            sites[where] = [fn, 1]

    def _make_default_rng(self, orig: Any) -> Any:
        inst = self

        def default_rng(*a: Any, **k: Any) -> Any:
            if inst.live and os.getpid() == inst.pid and (not a or a[0] is None) and k.get("seed") is None:
                from torchdoctor.runner.frames import short_path, user_frame

                uf = user_frame(2)
                where = short_path(f"{uf[0]}:{uf[1]}") if uf else "?"
                if where in inst.fresh or len(inst.fresh) < MAX_SITES:
                    inst.fresh[where] = inst.fresh.get(where, 0) + 1
            return orig(*a, **k)

        default_rng.__doc__ = getattr(orig, "__doc__", None)
        return default_rng

    def _make_iter_init(self, orig: Any) -> Any:
        inst = self

        def iter_init(it: Any, *a: Any, **k: Any) -> None:
            orig(it, *a, **k)
            if inst.live and os.getpid() == inst.pid and len(inst.loaders) < MAX_LOADERS:
                try:
                    from torchdoctor.runner.frames import short_path, user_frame
                    from torchdoctor.torch_internals import loader_base_seed, loader_iter_facts

                    workers = loader_iter_facts(it)["num_workers"] or 0
                    if workers:
                        uf = user_frame(2)
                        inst.loaders.append({"base_seed": loader_base_seed(it), "num_workers": workers,
                                             "where": short_path(f"{uf[0]}:{uf[1]}") if uf else None})
                except Exception:  # noqa: BLE001
                    pass

        return iter_init

    # ------------------------------------------------------------------ states
    def _states(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        try:
            v, internal, gauss = random.getstate()
            out["python"] = digest(array("Q", internal).tobytes() + repr((v, gauss)).encode())
        except Exception:  # noqa: BLE001
            out["python"] = None
        out["numpy"] = None
        if self.np is not None:
            try:
                st = self.np.random.get_state(legacy=True)
                out["numpy"] = digest(st[1].tobytes() + repr(st[2:]).encode())
            except Exception:  # noqa: BLE001
                pass
        torch = self.torch
        try:
            out["torch"] = digest(torch.random.default_generator.get_state().numpy().tobytes())
        except Exception:  # noqa: BLE001
            out["torch"] = None
        out["cuda"] = None
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                parts = [g.get_state().numpy().tobytes() for g in torch.cuda.default_generators]
                out["cuda"] = digest(b"".join(parts))
        except Exception:  # noqa: BLE001
            pass
        return out

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.live or len(self.steps) >= MAX_STEPS:
            return
        self.steps.append(step)
        st = self._states()
        for g in GENERATORS:
            self.states[g].append(st[g])
            self.by_step[g].append(self.counts[g])

    def uninstall(self, ctx: Any) -> None:
        if not getattr(self, "live", False):
            return
        self.live = False
        self._patches.undo()
        ctx.emit("rng_trace", steps=self.steps, states=self.states, start=self.start,
                 draws=dict(self.counts), draws_by_step=self.by_step,
                 sites={g: [{"where": w, "fn": fn, "count": n} for w, (fn, n) in s.items()]
                        for g, s in self.sites.items() if s},
                 unseeded_generators=[{"where": w, "count": n} for w, n in self.fresh.items()],
                 loaders=self.loaders)
