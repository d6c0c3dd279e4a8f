"""Findings-only expectations: what a fixture's report must find, and nothing about the rest.

A fixture's expectation (tests/golden/scripts/<path>.expect.json, tests/golden/checkpoint/<name>.expect.json)
is the sorted list of its findings, each as

    {"code": ..., "severity": ..., "evidence": {KEY: value for the identifying keys it has}}

The identifying keys (IDENTIFYING) are the evidence entries that say *which* case a finding is
about: the module, parameter, file:line, step, rank, function, site, call. Measured values (times,
bytes, shares, counts of samples), titles, fixes and explanatory text are left out: they belong
to the rule's own unit tests and to the few whole-report goldens that guard the JSON contract.
String values keep their numbers (lines, steps, indices); only the machine's paths are masked
(mask_paths). Host-load findings (fixture_runs.host_noise) are left out, as in the code set.

A finding code whose evidence has none of these keys is expected by (code, severity) alone; a
new rule need not touch this file (add a key here only when its evidence names the case under a
key not yet listed, and regenerate: `tests/golden/regen.py --findings`).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fixture_runs import host_noise  # noqa: E402

# Evidence keys that name the case: where (file:line, module, parameter, site, step, rank) and
# what (the function, op, call, generator, file). Deterministic by construction: a key whose value
# is timing (where a killed run stopped: stuck_at, waiting_in, steps_done) is not listed.
IDENTIFYING = frozenset({
    # where in the user's code
    "at", "backward_at", "call_site", "called_from", "created_at", "defined_at", "eval_called_at",
    "forward_at", "forward_line", "forward_source", "loader_built_at", "loop", "op_line",
    "optimizer_built_at", "read_at", "saved_at", "site", "step_called_at", "where",
    # which module / parameter / tensor / function
    "custom_function", "example", "first", "fn", "forward_node", "forward_op", "function",
    "model", "module", "module_class", "modules", "nonfinite_params", "op_module",
    "output_of", "param", "params", "tensors", "trained_models", "unregistered_tensors",
    "wrong_inputs", "wrong_on",
    # which step / rank / run outcome
    "above_10x_from_step", "consumed_at_step", "diverged_first", "exit_code", "first_divergent_step",
    "first_step", "phase", "rank", "refused_options", "signal", "step", "waiting",
    # which call / collective / compile guard / generator
    "call", "guard", "limit", "live_schedulers",
    # checkpoints: which file, which entries
    "file", "format", "holds", "missing", "top_level_keys", "written_as",
})

_PATHS: list[tuple[re.Pattern, str]] = []


def mask_paths(s: str) -> str:
    """The checkout, temp folders and the Python install masked; everything else kept."""
    if not _PATHS:
        pys = sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}, key=len, reverse=True)
        _PATHS.extend([
            (re.compile(r"[^\s'\"():]*/site-packages/"), "<site-packages>/"),
            (re.compile(re.escape(str(ROOT))), "<root>"),
            *[(re.compile(re.escape(p) + r"(?=/)"), "<python>") for p in pys],
            (re.compile(re.escape(tempfile.gettempdir()) + r"/[^\s'\":,)\]]*"), "<tmp>"),
            (re.compile(r"/(?:var/folders|private/tmp)/[^\s'\":,)\]]*"), "<tmp>"),
        ])
    for pat, rep in _PATHS:
        s = pat.sub(rep, s)
    return s


def _value(v):
    if isinstance(v, str):
        return mask_paths(v)
    if isinstance(v, dict):
        return {mask_paths(str(k)): _value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    return v


def finding_key(f: dict) -> dict:
    ev = f.get("evidence") if isinstance(f.get("evidence"), dict) else {}
    return {"code": f["code"], "severity": f["severity"],
            "evidence": {k: _value(ev[k]) for k in sorted(ev) if k in IDENTIFYING}}


def expected_findings(report: dict) -> list[dict]:
    """The report's findings as expectations, sorted (host-load findings left out)."""
    keys = [finding_key(f) for f in report.get("findings", []) if not host_noise(f)]
    return sorted(keys, key=lambda k: (k["code"], k["severity"], repr(k["evidence"])))


def expectation(exit_code: int, report: dict) -> dict:
    """The whole expectation file: the exit code, the status and the findings. A status
    "findings" whose only findings were host load reads "ok" (what it says on a quiet box)."""
    findings = expected_findings(report)
    status = report.get("status")
    if status == "findings" and not findings:
        status = "ok"
    return {"exit": exit_code, "status": status, "findings": findings}


def differences(got: dict, want: dict) -> str:
    """A readable account of how two expectations differ ('' when equal)."""
    if got == want:
        return ""
    lines = []
    for k in ("exit", "status"):
        if got.get(k) != want.get(k):
            lines.append(f"{k}: got {got.get(k)!r}, expected {want.get(k)!r}")
    g, w = got.get("findings", []), want.get("findings", [])
    for f in w:
        if f not in g:
            lines.append(f"missing: {f}")
    for f in g:
        if f not in w:
            lines.append(f"unexpected: {f}")
    return "\n".join(lines) or f"same findings, different counts: got {g}, expected {w}"
