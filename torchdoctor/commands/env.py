"""`torchdoctor env [--json]`: the environment a PyTorch bug report needs, gathered safely.

The report is built by :mod:`torchdoctor.pipeline.env` (collect, judge); this command checks
its options and renders it.
"""

from __future__ import annotations

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOptNoArgs, JsonOpt, JunitOpt, SarifOpt, emit, guarded


def register(app: typer.Typer) -> None:
    @app.command(help="Environment and hardware report for bug reports: torch build, CUDA, cuDNN, NCCL, "
                      "GPUs (NVML), torch flags, env vars, package versions.")
    @guarded
    def env(as_json: JsonOpt = False, fail_on: FailOnOpt = "error", html: HtmlOptNoArgs = None,
            sarif: SarifOpt = None, junit: JunitOpt = None) -> None:
        from torchdoctor.commands._common import check_fail_on, prepare_html, prepare_outputs
        from torchdoctor.pipeline.env import run_env

        check_fail_on(fail_on)
        html_path = prepare_html(html, None)
        outputs = prepare_outputs(sarif=sarif, junit=junit)
        emit(run_env(), as_json, fail_on, html=html_path, outputs=outputs)
