"""``torchdoctor compare BEFORE.json AFTER.json``: each delta with its noise band and a verdict."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchdoctor.commands._common import HtmlOpt, JsonOpt, guarded
from torchdoctor.errors import DoctorError

HELP = ("Compare two saved reports (--json output or report.json) of the same training before and after a "
        "change: step time and phases, memory peaks and growing sites, MFU, findings appeared/resolved; "
        "each delta with its noise band from the reports' per-step series and a verdict "
        "(docs/compare.md). Exit 1 under --fail-on regression when anything got worse beyond noise.")


def register(app: typer.Typer) -> None:
    @app.command("compare", help=HELP)
    @guarded
    def compare(
        before: Annotated[str, typer.Argument(metavar="BEFORE.json", show_default=False,
                                              help="The report of the run before the change.")],
        after: Annotated[str, typer.Argument(metavar="AFTER.json", show_default=False,
                                             help="The report of the run after the change.")],
        as_json: JsonOpt = False,
        fail_on: Annotated[Optional[str], typer.Option(
            "--fail-on", metavar="regression",
            help="Exit 1 when the comparison finds a regression (a delta worse beyond its noise band, "
                 "a warning/error finding or a growing memory site that appeared).")] = None,
        html: HtmlOpt = None,
    ) -> None:
        import sys

        from torchdoctor.commands._common import prepare_html
        from torchdoctor.compare.judge import compare as judge
        from torchdoctor.compare.load import load_report

        if fail_on is not None and fail_on.strip().lower() != "regression":
            raise DoctorError(f"--fail-on must be 'regression' here, not {fail_on!r}")
        html_path = prepare_html(html, None)
        rb, ra = load_report(before), load_report(after)
        cmp = judge(rb, ra, before, after)
        if html_path is not None:
            from torchdoctor.compare.render import render_html
            from torchdoctor.report.html.output import write_html

            write_html(html_path, render_html(cmp, rb, ra))
        if as_json:
            from torchdoctor.report.jsonout import dumps

            sys.stdout.write(dumps(cmp) + "\n")
        else:
            from torchdoctor.compare.render import render_console
            from torchdoctor.report.console import make_console

            render_console(cmp, make_console())
        raise typer.Exit(1 if fail_on is not None and cmp["regressions"] else 0)
