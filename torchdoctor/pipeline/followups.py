"""Follow-up runs: a second, instrumented run that a finding needs to say more.

Some crashes are only explained by running again with costlier instruments, e.g.
``inplace-modified`` → re-run up to the failing step under anomaly mode to name the forward
line. A follow-up is registered for a finding code (in any module under
``torchdoctor/pipeline/``, discovered automatically)::

    from torchdoctor.pipeline.followups import followup

    @followup("inplace-modified")
    def anomaly_rerun(ev: Evidence, relaunch) -> dict:
        ev2 = relaunch({"anomaly": True, "steps": ev.result.get("steps", 0) + 1})
        return {"forward_line": ...}   # merged into the finding's evidence

``relaunch(extra_options, probe=None) -> Evidence`` runs the same script with the same
arguments and probe (or under another probe's instruments, e.g. ``checkup``'s NaN replay runs
under ``nan``), the options updated with ``extra_options`` (the instruments read them from
``ctx.options``), still bounded by ``--timeout``; its output goes to stderr like the first
run's. Each re-run is timed into ``metrics.followups``. The returned dict is merged into the
finding's evidence, except two directives: ``_skill`` re-routes the finding, ``_replace`` (a
``Finding``) takes its place — a re-run that located the problem better says so with a new
finding rather than a patched title. A follow-up that raises is reported as an
``internal-error`` finding; the original finding stays.
"""

from __future__ import annotations

from typing import Any, Callable

Relaunch = Callable[..., Any]  # (extra_options, probe=None) -> Evidence
_FOLLOWUPS: dict[str, list[Callable[[Any, Relaunch], dict]]] = {}


def followup(code: str):
    def deco(fn):
        _FOLLOWUPS.setdefault(code, [])
        if fn not in _FOLLOWUPS[code]:
            _FOLLOWUPS[code].append(fn)
        return fn

    return deco


def followups_for(code: str) -> list[Callable[[Any, Relaunch], dict]]:
    from torchdoctor.pipeline.registry import load_probe_modules

    load_probe_modules()
    return list(_FOLLOWUPS.get(code, []))
