"""The docs of the finding codes: where each code's page lives, the headings it must have, and the
catalogue page (``docs/findings/README.md``) generated from the declarations.

The catalogue is never edited by hand; regenerate it after declaring, moving or changing a code::

    python -m torchdoctor.docs catalogue > docs/findings/README.md
    python -m torchdoctor.docs catalogue --check     # exit 1 when the committed page is stale

``tests/test_docs_catalogue.py`` fails when the committed page differs from :func:`catalogue_markdown`.
"""

from __future__ import annotations

import sys
from pathlib import Path

REQUIRED_HEADINGS = ("What it means", "Why it matters", "How it is measured", "How to fix", "References")
CATALOGUE_PAGE = "README.md"  # in docs/findings/: the generated table of every code, not a code's page
REGENERATE = "python -m torchdoctor.docs catalogue > docs/findings/README.md"


def findings_dirs() -> list[Path]:
    """Candidate folders of docs/findings: the source tree, then an installed share/ copy."""
    here = Path(__file__).resolve().parent
    return [here.parent / "docs" / "findings", Path(sys.prefix) / "share" / "torchdoctor" / "docs" / "findings"]


def doc_path(code: str) -> Path | None:
    for d in findings_dirs():
        p = d / f"{code}.md"
        if p.is_file():
            return p
    return None


def code_pages(folder: Path) -> list[Path]:
    """The per-code pages of a docs/findings folder (every ``*.md`` but the catalogue)."""
    return sorted(p for p in folder.glob("*.md") if p.name != CATALOGUE_PAGE)


# -- the catalogue page ---------------------------------------------------------------------------

_HEAD = f"""\
<!-- GENERATED from the code declarations (torchdoctor.catalog): do not edit by hand.
     Regenerate: {REGENERATE}
     tests/test_docs_catalogue.py fails when this page and the declarations differ. -->
# Finding codes

Every finding torchdoctor can raise, one row per code, generated from the code's single declaration
(`declare(code, skill, severity, summary, thresholds=...)` in the rule module that raises it, see
[../architecture.md](../architecture.md)). Each code has its own page (the link): what it means, why it
matters, how it is measured (with its thresholds), how to fix it, references. `torchdoctor explain CODE`
prints that page; `torchdoctor explain --list` lists the codes.

How codes are raised:

- A finding is raised from measured evidence, never from the script's file name or text alone
  (static hints may add to evidence, never replace it). Healthy training raises no `warning` or
  `error`: a false alarm is a bug.
- A rule that cannot judge a run says so in the report's `skipped` list (`{{rule, reason}}`):
  not applicable is not healthy.
- A code, once shipped, keeps its meaning.
- Thresholds are named constants of the rule module (the *thresholds* column); each code's page
  states them as `` `NAME` = value `` lines under "How it is measured".

Severities (the *severity* column is the default; a rule may raise a code at another severity when
its evidence says so, and the page says when):

| severity | meaning | exit code |
|---|---|---|
| `error` | a defect that breaks the run, corrupts its results or dominates its cost | 1 |
| `warning` | a likely problem worth fixing | 0, or 1 with `--fail-on warning` |
| `info` | a fact worth knowing, not a defect | 0 |

The *probes* column lists the probes whose rules declare the code in their `raises` (derived by
`torchdoctor.judge.probes_of`): the script probes `run` (every script probe), `checkup`, `profile`,
`memory`, `nan`, `ranks` (the cross-rank view of a run with `--nproc-per-node` or `dist SCRIPT`), and
`checkpoint-audit`, `env`, `dist` (the collective self-test), `dist-env` (the launch environment). A
dash: no rule declares it (`internal-error` is raised by the judge itself, under any probe, when a
rule crashes).

The `skill` field routes a finding to one of eight specialties (the same eight that `torchdoctor ask`
routes to); the codes are grouped by skill below.
"""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _number(value: float | int) -> str:
    return repr(value)


def catalogue_markdown() -> str:
    """The catalogue page, from :func:`torchdoctor.catalog.catalog` and :func:`~torchdoctor.judge.probes_of`."""
    from torchdoctor.catalog import catalog
    from torchdoctor.judge import probes_of
    from torchdoctor.skills import ALL_SKILLS

    codes = catalog()
    lines = [_HEAD]
    for skill in ALL_SKILLS:
        infos = sorted((i for i in codes.values() if i.skill == skill), key=lambda i: i.code)
        lines.append(f"## {skill}\n")
        if not infos:
            lines.append("No code yet.\n")
            continue
        lines.append("| code | severity | probes | summary | thresholds |")
        lines.append("|---|---|---|---|---|")
        for i in infos:
            probes = ", ".join(sorted(probes_of(i.code))) or "—"
            thresholds = ", ".join(f"`{k}` = {_number(v)}" for k, v in sorted(i.thresholds.items()))
            lines.append(f"| [`{i.code}`]({i.code}.md) | {i.severity} | {probes} | {_cell(i.summary)} "
                         f"| {thresholds or '—'} |")
        lines.append("")
    lines.append(f"{len(codes)} codes.")
    return "\n".join(lines) + "\n"


def catalogue_path() -> Path:
    return findings_dirs()[0] / CATALOGUE_PAGE


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m torchdoctor.docs catalogue [--check]"
    if not args or args[0] != "catalogue" or set(args[1:]) - {"--check"}:
        print(usage, file=sys.stderr)
        return 2
    text = catalogue_markdown()
    if "--check" in args:
        path = catalogue_path()
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale; regenerate it: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
