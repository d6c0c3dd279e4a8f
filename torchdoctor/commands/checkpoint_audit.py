"""`torchdoctor checkpoint-audit PATH`: what a checkpoint holds and lacks, read without running it."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOpt, JsonOpt, JunitOpt, SarifOpt, emit, guarded
from torchdoctor.errors import DoctorError

HELP = (
    "What a checkpoint holds and lacks, read without running its code: torch.save (zip or legacy), "
    "safetensors, DCP folders, Hugging Face shard indexes and Trainer folders. Exit 1 when a finding is an "
    "error (including ckpt-unreadable for a file that is not a readable checkpoint); exit 2 when PATH is "
    "missing or cannot be opened."
)


def register(app: typer.Typer) -> None:
    @app.command("checkpoint-audit", help=HELP)
    @guarded
    def checkpoint_audit(
        path: Annotated[str, typer.Argument(help="Checkpoint file or folder.", show_default=False)],
        expect: Annotated[str, typer.Option(
            "--expect", metavar="auto|resume|weights",
            help="What the checkpoint is for: resume (needs optimizer, RNG, step …), weights (inference/"
                 "fine-tuning export), auto (resume if it holds any training state).")] = "auto",
        model: Annotated[Optional[str], typer.Option(
            "--model", metavar="MODULE:FACTORY",
            help="Compare with this model's state_dict (imports your module and calls the factory).")] = None,
        unsafe_load: Annotated[bool, typer.Option(
            "--unsafe-load", help="Really unpickle (weights_only=False): RUNS any code in the file. "
                                  "Only for files you trust.")] = False,
        no_scan: Annotated[bool, typer.Option("--no-scan", help="Skip the NaN/Inf scan of tensor data.")] = False,
        out: Annotated[Optional[str], typer.Option("--out", help="Also write report.json/report.txt here.")] = None,
        as_json: JsonOpt = False,
        fail_on: FailOnOpt = "error",
        html: HtmlOpt = None,
        sarif: SarifOpt = None,
        junit: JunitOpt = None,
    ) -> None:
        from torchdoctor.checkpoint.audit import EXPECT, Options, warn_unsafe

        from torchdoctor.commands._common import check_fail_on, prepare_html, prepare_out

        check_fail_on(fail_on)
        out = prepare_out(out)  # an unfit --out is exit 2 before the audit, not after
        html_path = prepare_html(html, out)
        from torchdoctor.commands._common import prepare_outputs

        outputs = prepare_outputs(sarif=sarif, junit=junit)
        exp = expect.strip().lower()
        if exp not in EXPECT:
            raise DoctorError(f"--expect must be one of {', '.join(EXPECT)}, not {expect!r}")
        if unsafe_load:
            warn_unsafe()
        from torchdoctor.pipeline.checkpoint import run

        report = run(path, Options(expect=exp, model=model, unsafe_load=unsafe_load, scan=not no_scan))
        emit(report, as_json, fail_on, out, html=html_path, outputs=outputs)
