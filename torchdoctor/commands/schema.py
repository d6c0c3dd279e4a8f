"""``torchdoctor schema``: the JSON Schema (draft 2020-12) of the report, from the declarations."""

from __future__ import annotations

import typer

from torchdoctor.commands._common import guarded


def register(app: typer.Typer) -> None:
    @app.command(help="Print the JSON Schema (draft 2020-12) of the JSON report (--json, report.json), "
                      "generated from torchdoctor's own declarations and versioned with the report's "
                      "`schema` field (docs/json.md).")
    @guarded
    def schema() -> None:
        import json
        import sys

        from torchdoctor.schema import report_schema

        sys.stdout.write(json.dumps(report_schema(), indent=2, ensure_ascii=False) + "\n")
