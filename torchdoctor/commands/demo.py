"""``torchdoctor demo``: a checkup of a bundled example script with a real problem."""

from __future__ import annotations

from typing import Annotated

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOptNoArgs, JsonOpt, JunitOpt, SarifOpt, eprint, guarded

EXAMPLE = "slow_loader_train.py"
DEMO_STEPS = 30
DEMO_TIMEOUT_S = 120.0


def register(app: typer.Typer) -> None:
    @app.command("demo")
    @guarded
    def demo(
        as_json: JsonOpt = False,
        steps: Annotated[int, typer.Option("--steps", metavar="N",
                                           help="Steps to run the example for.")] = DEMO_STEPS,
        fail_on: FailOnOpt = "error",
        html: HtmlOptNoArgs = None,
        sarif: SarifOpt = None,
        junit: JunitOpt = None,
    ) -> None:
        """Run `checkup` on a bundled example training script that has a real problem."""
        from torchdoctor.commands._common import check_fail_on, emit, prepare_html
        from torchdoctor.examples import path

        check_fail_on(fail_on)  # bad usage: exit 2 before the run, not after it
        html_path = prepare_html(html, None)
        from torchdoctor.commands._common import prepare_outputs

        outputs = prepare_outputs(sarif=sarif, junit=junit)
        from torchdoctor.pipeline.options import RunOptions
        from torchdoctor.pipeline.run import run_probe

        script = path(EXAMPLE)
        eprint(f"torchdoctor demo: checkup of the bundled example {script} ({steps} steps)")
        report = run_probe("checkup", str(script), [], RunOptions(steps=steps, timeout=DEMO_TIMEOUT_S))
        report.command = "demo"
        report.target = f"{EXAMPLE} (bundled example)"
        emit(report, as_json, fail_on, html=html_path, outputs=outputs)
