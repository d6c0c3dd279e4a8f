"""Where the HTML report goes, checked before any work, written without harming a user file.

``--html`` alone: ``torchdoctor-report.html`` in ``--out DIR`` (or the current folder);
``--html=PATH`` or ``--html PATH`` (where unambiguous: :func:`expand_bare_html`): that file. Under ``--out DIR`` the ``torchdoctor-report.html`` is always
written beside ``report.json`` (a bare ``--html`` then adds nothing). A bare ``--html`` is told from ``--html PATH`` before typer parses the command
line (:func:`expand_bare_html`): the word after a bare ``--html`` is the script, never a path.

An existing file is replaced only when it is a torchdoctor report (its first line is
:data:`torchdoctor.report.html.page.MARKER`): ``--html=train.py`` is refused (exit 2), never
overwritten. Writing goes through a temporary file in the same folder and a rename, so an
interrupted write leaves the old report, and a symlink at PATH is replaced, not followed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchdoctor.errors import DoctorError

HTML_DEFAULT = "\x00default"  # what a bare --html becomes (argv cannot hold a NUL)
DEFAULT_NAME = "torchdoctor-report.html"
OUT_NAME = DEFAULT_NAME  # under --out: beside report.json, whatever --html says


HTML_SUFFIXES = (".html", ".htm")


def expand_bare_html(args: list[str], value_options: set[str], interspersed: bool,
                     positional: bool = True) -> list[str]:
    """``--html`` with no ``=`` among torchdoctor's own options → ``--html=<default>``, or
    ``--html=PATH`` when the next word is unambiguously its path: it ends in ``.html``/``.htm``,
    or the command takes no positional argument at all (``positional=False``: ``demo``, ``env``),
    so any next word that is not an option can only be the path.

    Own options are those before SCRIPT (the first positional, for commands that stop parsing
    there: ``interspersed=False``) or anywhere (``interspersed=True``, e.g. checkpoint-audit);
    ``value_options`` take the next word as their value (``--steps 3``)."""
    out, i = list(args), 0
    while i < len(out):
        tok = out[i]
        if tok == "--":
            break
        if tok == "--html":
            nxt = out[i + 1] if i + 1 < len(out) else None
            if nxt is not None and nxt != "--" and not nxt.startswith("-") and (
                    not positional or nxt.lower().endswith(HTML_SUFFIXES)):
                out[i:i + 2] = ["--html=" + nxt]
            else:
                out[i] = "--html=" + HTML_DEFAULT
        elif tok.startswith("-") and tok != "-":
            if tok in value_options:
                i += 1  # its value
        elif not interspersed:
            break  # SCRIPT: everything after it belongs to the script
        i += 1
    return out


def html_target(html: str | None, out: str | None) -> Path | None:
    """The file to write for ``--html`` (None: not asked); DoctorError (exit 2) if unfit."""
    if html is None:
        return None
    if html == HTML_DEFAULT or html == "":
        p = Path(out) / DEFAULT_NAME if out else Path.cwd() / DEFAULT_NAME
    else:
        p = Path(html)
    if p.is_dir():
        raise DoctorError(f"--html {html}: is a folder", hint="pass a file name: --html=report.html")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise DoctorError(f"--html {p}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise DoctorError(f"--html {p}: cannot write to {parent}")
    if p.exists() and not is_ours(p):
        raise DoctorError(f"--html {p}: the file exists and is not a torchdoctor report; "
                          f"it is left as it is", hint="pass a new file name")
    return p


def is_ours(path: Path) -> bool:
    from torchdoctor.report.html.page import MARKER

    try:
        with open(path, "rb") as f:
            return f.read(len(MARKER)).decode("utf-8", "replace") == MARKER
    except OSError:
        return False


def write_html(path: Path, text: str) -> None:
    """Replace ``path`` atomically (temp file in the same folder, then rename)."""
    from torchdoctor.report.formats import write_text

    write_text(path, text, ".html")


def report_html(report: Any) -> str:
    """The HTML of a Report (through its JSON form, as a saved report.json renders)."""
    import json

    from torchdoctor.report.html import render_html
    from torchdoctor.report.jsonout import render_json

    return render_html(json.loads(render_json(report)))


def _render_dict(data: dict[str, Any]) -> str:
    from torchdoctor.report.html import render_html

    return render_html(data)


def __getattr__(name: str):  # FORMAT for report/formats.py (the one interface of the file formats)
    if name == "FORMAT":
        from torchdoctor.report.formats import Format
        from torchdoctor.report.html.page import MARKER

        return Format("html", ".html", MARKER, _render_dict)
    raise AttributeError(name)
