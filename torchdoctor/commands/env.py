"""`torchdoctor env [--json]`: the environment a PyTorch bug report needs, gathered safely.

Collection (torchdoctor.envinfo) runs every probe at once, each bounded by a timeout; a probe
that fails or hangs shows "could not collect: ..." and the rest still prints. The rules of probe
``env`` (torchdoctor/rules/env.py) judge the collected dict through the guarded ``judge()``; the
report holds it in metrics["env"].
"""

from __future__ import annotations

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOptNoArgs, JsonOpt, JunitOpt, SarifOpt, emit, guarded


def build_report(env: dict):
    """The env Report for a collected (or saved) env dict: context, metrics, findings, skips."""
    from torchdoctor.envinfo import report_context
    from torchdoctor.findings import Report
    from torchdoctor.judge import judge

    report = Report(command="env", metrics={"env": env}, context=report_context(env))
    judge("env", env, report)
    return report


def register(app: typer.Typer) -> None:
    @app.command(help="Environment and hardware report for bug reports: torch build, CUDA, cuDNN, NCCL, "
                      "GPUs (NVML), torch flags, env vars, package versions.")
    @guarded
    def env(as_json: JsonOpt = False, fail_on: FailOnOpt = "error", html: HtmlOptNoArgs = None,
            sarif: SarifOpt = None, junit: JunitOpt = None) -> None:
        from torchdoctor.commands._common import check_fail_on, prepare_html, prepare_outputs
        from torchdoctor.envinfo import collect

        check_fail_on(fail_on)
        html_path = prepare_html(html, None)
        outputs = prepare_outputs(sarif=sarif, junit=junit)
        emit(build_report(collect()), as_json, fail_on, html=html_path, outputs=outputs)
