"""``env`` through the pipeline: collect the environment, judge it, one Report.

Collection (:mod:`torchdoctor.envinfo`) runs every probe at once, each bounded by a timeout; a
probe that fails or hangs shows "could not collect: ..." and the rest still prints. The rules of
probe ``env`` (torchdoctor/rules/env.py) judge the collected dict through the guarded
``judge()``; the report holds it in ``metrics["env"]``.
"""

from __future__ import annotations

from typing import Any

from torchdoctor.findings import Report


def run_env() -> Report:
    """``torchdoctor env``: collect this machine's environment and judge it."""
    from torchdoctor.envinfo import collect

    return build_report(collect())


def build_report(env: dict[str, Any]) -> Report:
    """The env Report for a collected (or saved) env dict: context, metrics, findings, skips."""
    from torchdoctor.envinfo import report_context
    from torchdoctor.judge import judge

    report = Report(command="env", metrics={"env": env}, context=report_context(env))
    judge("env", env, report)
    return report
