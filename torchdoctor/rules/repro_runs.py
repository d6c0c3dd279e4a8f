"""repro's measured codes: two runs of the same script differ — which generator, which op, or
neither pinned. Judged on the ``repro_compare`` evidence that ``reprocheck/flow.py`` builds from
the two runs (and, when they diverge, the localising pair and the deterministic pair). The
informational ``unseeded-run`` (rules/repro.py) stays for ``checkup``."""

from __future__ import annotations

from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import NotApplicable, rule
from torchdoctor.skills import CHECKPOINTING

UNSEEDED_RNG = declare("unseeded-rng", CHECKPOINTING, "warning",
                       "a global random generator gave different values in two runs")
NONDETERMINISTIC_OP = declare("nondeterministic-op", CHECKPOINTING, "warning",
                              "an op gave different outputs for identical inputs")
NONDETERMINISTIC_RUN = declare("nondeterministic-run", CHECKPOINTING, "warning",
                               "two runs differ and no single cause was pinned")

FIX_BY_GENERATOR = {
    "python": "seed Python's generator at start-up: random.seed(s) (or give the sampler its own "
              "random.Random(s))",
    "numpy": "seed NumPy's global generator: numpy.random.seed(s) — torch.manual_seed does not "
             "seed it — or draw from a seeded numpy.random.default_rng(s) passed to the dataset",
    "torch": "seed torch once at start-up with a fixed value: torch.manual_seed(s)",
    "cuda": "seed torch once at start-up with a fixed value: torch.manual_seed(s) (seeds every "
            "CUDA device too)",
    "dataloader-workers": "give the DataLoader generator=torch.Generator().manual_seed(s) (the "
                          "workers' base seed is drawn from it)",
    "numpy-default-rng": "pass a seed: numpy.random.default_rng(s) (without one it draws a fresh "
                         "state from the OS every run)",
}


def _compare(ev: Evidence) -> dict[str, Any]:
    c = ev.last("repro_compare")
    if c is None or not c.get("compared"):
        raise NotApplicable("the two runs were not compared")
    if c.get("identical"):
        return {}
    return c


def _where(op: dict[str, Any]) -> str:
    parts = [op.get("op") or "?"]
    if op.get("module"):
        parts.append(f"in {op['module']}")
    if op.get("where"):
        parts.append(f"at {op['where']}")
    return " ".join(parts)


def _divergence(c: dict[str, Any]) -> dict[str, Any]:
    d = c.get("diverged") or {}
    return {"first_divergent_step": c.get("first_divergent_step"),
            "diverged_first": d.get("description"), "steps_compared": c.get("steps_compared")}


@rule("unseeded-rng", probes={"repro"}, needs={"repro_compare"}, raises=[UNSEEDED_RNG])
def unseeded_rng(ev: Evidence) -> list[Finding]:
    c = _compare(ev)
    if not c:
        return []
    gens = (c.get("generators") or {}).get("implicated") or []
    if not gens:
        return []
    names = ", ".join(g["label"] for g in gens)
    site = next((s for g in gens for s in g.get("sites") or [] if s.get("where")), None)
    op = c.get("first_divergent_op") or {}
    if site is None and op.get("kind") == "random" and op.get("where"):
        # torch's own draws are not counted: the localising pair saw the op that drew
        site = {"where": op["where"], "fn": op.get("op")}
    at = f"; first draw at {site['where']} ({site['fn']})" if site else ""
    ev_out = {**_divergence(c), "generators": gens,
              "ruled_out": (c.get("generators") or {}).get("ruled_out") or []}
    fixes = [FIX_BY_GENERATOR[g["generator"]] for g in gens if g["generator"] in FIX_BY_GENERATOR]
    return [finding("unseeded-rng",
                    f"two runs diverged at step {c.get('first_divergent_step')}: {names} gave "
                    f"different values in the two runs{at}",
                    ev_out, fix="; ".join(fixes))]


@rule("nondeterministic-op", probes={"repro"}, needs={"repro_compare"}, raises=[NONDETERMINISTIC_OP])
def nondeterministic_op(ev: Evidence) -> list[Finding]:
    c = _compare(ev)
    op = (c or {}).get("first_divergent_op") or {}
    if op.get("kind") != "nondeterministic":
        return []
    det = c.get("deterministic") or {}
    ev_out = {**_divergence(c), "op": op}
    cost = ""
    if det:
        ev_out["deterministic"] = det
        if det.get("reproducible") and det.get("cost"):
            cost = (f" Measured: with deterministic algorithms the runs were identical, at "
                    f"{det['cost']:.2f}× the step time ({det.get('median_step_ms')} vs "
                    f"{det.get('baseline_median_step_ms')} ms).")
        elif det.get("reproducible") is False:
            cost = " Measured: with deterministic algorithms the runs still differed."
        elif det.get("failure"):
            cost = f" Measured: deterministic mode failed: {det['failure']}."
    name = (op.get("op") or "").replace("aten::", "")
    alt = ALTERNATIVES.get(name.rstrip("_"), "")
    return [finding("nondeterministic-op",
                    f"{_where(op)} gave different outputs for identical inputs in two runs "
                    f"(step {c.get('first_divergent_step')})",
                    ev_out,
                    fix=("torch.use_deterministic_algorithms(True) with CUBLAS_WORKSPACE_CONFIG="
                         ":4096:8 set before CUDA starts (and torch.backends.cudnn.benchmark = "
                         "False)" + (f"; or {alt}" if alt else "") + "." + cost))]


ALTERNATIVES = {
    "index_add": "accumulate in float64 (index_add_ on a float64 copy), or sort the indices and "
                 "use a segment sum",
    "scatter_add": "accumulate in float64, or sort the indices and use a segment reduction",
    "index_put": "avoid accumulate=True on CUDA: sort and reduce duplicates first",
    "scatter_reduce": "accumulate in float64, or reduce sorted segments",
    "cudnn_convolution": "torch.backends.cudnn.benchmark = False and deterministic = True",
    "convolution": "torch.backends.cudnn.benchmark = False and deterministic = True",
}


@rule("nondeterministic-run", probes={"repro"}, needs={"repro_compare"}, raises=[NONDETERMINISTIC_RUN])
def nondeterministic_run(ev: Evidence) -> list[Finding]:
    c = _compare(ev)
    if not c:
        return []
    gens = (c.get("generators") or {}).get("implicated") or []
    op = c.get("first_divergent_op") or {}
    if gens or op.get("kind") == "nondeterministic":
        return []
    ruled = [f"{g['label']}: {g['why']}" for g in (c.get("generators") or {}).get("ruled_out") or []]
    why = {"random": f"{_where(op)} drew different random numbers (torch's generator) although "
                     f"no global generator's state differed",
           "inputs": f"{_where(op)} received different inputs first: values made outside torch's "
                     f"ops (Python, NumPy, the file system, time)",
           "control-flow": f"the runs ran different ops from {_where(op)} on",
           "not-reproduced": op.get("reason", ""),
           "unavailable": op.get("reason", "")}.get(op.get("kind"), "")
    if op.get("kind") == "not-reproduced":  # complete traces that agreed (not a cut or missing one)
        ruled.append("no op gave different outputs for identical inputs in the localising pair")
    return [finding("nondeterministic-run",
                    f"two runs of the same script diverged at step "
                    f"{c.get('first_divergent_step')} ({(c.get('diverged') or {}).get('description')})"
                    f"; no single cause was pinned",
                    {**_divergence(c), "first_divergent_op": op, "localised": why,
                     "ruled_out": ruled},
                    fix="Look at what the script reads besides its seeds (time, environment, files "
                        "that change, thread or process order); seed every generator and set "
                        "torch.use_deterministic_algorithms(True); re-run torchdoctor repro to "
                        "confirm.")]
