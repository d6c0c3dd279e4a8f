"""`torchdoctor explain CODE`: print the doc page of a finding code."""

from __future__ import annotations

import difflib
from typing import Annotated

import typer

from torchdoctor.commands._common import guarded
from torchdoctor.errors import DoctorError


def explain_text(code: str) -> str:
    from torchdoctor.catalog import catalog
    from torchdoctor.docs import doc_path

    codes = catalog()
    key = code.strip().lower()
    if key not in codes:
        near = difflib.get_close_matches(key, list(codes), n=4, cutoff=0.5)
        near += [c for c in codes if key and key in c and c not in near][:4]
        hint = ("did you mean: " + ", ".join(near[:4])) if near else "run `torchdoctor explain --list` for all codes"
        raise DoctorError(f"unknown finding code {code!r}", hint=hint)
    path = doc_path(key)
    if path is None:
        raise DoctorError(f"no doc page found for {key!r}", hint="is torchdoctor installed with its docs/?")
    return path.read_text()


def register(app: typer.Typer) -> None:
    @app.command(help="Print the doc page of a finding code (e.g. `torchdoctor explain dataloader-bound`).")
    @guarded
    def explain(
        code: Annotated[str, typer.Argument(help="A finding code, e.g. memory-growth.")] = "",
        list_codes: Annotated[bool, typer.Option("--list", help="List every finding code.")] = False,
    ) -> None:
        from rich.console import Console
        from rich.markdown import Markdown

        con = Console(highlight=False)
        if list_codes or not code:
            from torchdoctor.catalog import catalog

            if not list_codes:
                raise DoctorError("missing finding code", hint="e.g. `torchdoctor explain memory-growth`, or --list")
            for info in sorted(catalog().values(), key=lambda i: (i.skill, i.code)):
                con.print(f"{info.code:32} {info.severity:8} {info.skill:36} {info.summary}", markup=False)
            return
        con.print(Markdown(explain_text(code)))
