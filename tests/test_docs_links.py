"""Docs point only inside the repository, and every repository path they name exists.

Checked in README.md and docs/**/*.md: relative Markdown links resolve to a file or folder of the
repository; paths under docs/, torchdoctor/, tests/ or bench/ (in backticks or in running text)
exist; no page cites a document kept outside the repository (the first contract, catalogue, design
notes, seeds) or a machine's own folders. Module docstrings and comments in torchdoctor/ cite no
such document either. Placeholders (`docs/findings/CODE.md`, globs, `{tmp}`) are not paths.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")])
PACKAGE = sorted(ROOT.glob("torchdoctor/**/*.py"))

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
TOP = r"(?:docs|torchdoctor|tests|bench)/"
PATH_IN_TEXT = re.compile(rf"(?<![\w./-]){TOP}[\w./-]*?\.(?:md|py|sh|json|txt|toml|cfg)(?![\w/])")
PATH_TOKEN = re.compile(rf"^{TOP}[\w./-]*$")
PLACEHOLDER = re.compile(r"[*<>{}$…]|\.\.\.|\b(?:CODE|NAME|FAMILY|PROBE)\b")
# documents that live outside the repository, and a machine's own folders
OUTSIDE = re.compile(r"(?<![\w/.])spec/|CONTRACT\.md|FINDINGS\.md|NOTES\.md|DESIGN\.md|KINDS\.md|"
                     r"(?<![\w/.])seeds/|(?<![\w:/.])\.\./shared/|(?<![\w/.])/work/")
OUTSIDE_IN_CODE = re.compile(r"CONTRACT\.md|FINDINGS\.md|NOTES\.md|DESIGN\.md|(?<![\w/.])spec/|"
                             r"(?<![\w/.])seeds/\d|\.\./shared/")


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def repo_paths(text: str) -> set[str]:
    """The repository paths a page names: in running text and code, and whole inline code spans."""
    found = set(PATH_IN_TEXT.findall(text))
    for span in INLINE.findall(FENCE.sub("", text)):
        token = re.sub(r"(?::\d+|::\w+)$", "", span.strip())
        if PATH_TOKEN.match(token):
            found.add(token)
    return {p.rstrip(".") for p in found if not PLACEHOLDER.search(p)}


def links(text: str) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", target):  # a URL (https:, mailto:) or an anchor
            continue
        out.append(target.split("#", 1)[0])
    return [t for t in out if t]


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_relative_links_resolve_inside_the_repository(page):
    bad = []
    for target in links(page.read_text()):
        dest = (page.parent / target).resolve()
        if not dest.is_relative_to(ROOT) or not dest.exists():
            bad.append(target)
    assert not bad, f"{rel(page)}: broken or outside links: {bad}"


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_named_repository_paths_exist(page):
    missing = sorted(p for p in repo_paths(page.read_text()) if not (ROOT / p).exists())
    assert not missing, f"{rel(page)} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("page", DOCS, ids=rel)
def test_docs_cite_nothing_outside_the_repository(page):
    hits = sorted({m.group(0) for m in OUTSIDE.finditer(page.read_text())})
    assert not hits, f"{rel(page)} cites files outside the repository: {hits}"


def test_package_cites_nothing_outside_the_repository():
    hits = [f"{rel(p)}:{n}: {line.strip()}" for p in PACKAGE
            for n, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE_IN_CODE.search(line)]
    assert not hits, "torchdoctor/ cites files outside the repository:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_are_for(tmp_path):
    text = ("See `docs/nope.md`, torchdoctor/nope.py and [x](nope.md); spec/CONTRACT.md; NOTES.md; "
            "`docs/findings/CODE.md` and `tests/fixtures/scripts/**.py` are placeholders; "
            "[ok](contract.md#commands), [web](https://pytorch.org/docs/stable/notes/cuda.html).")
    assert repo_paths(text) == {"docs/nope.md", "torchdoctor/nope.py"}
    assert links(text) == ["nope.md", "contract.md"]
    assert {m.group(0) for m in OUTSIDE.finditer(text)} == {"spec/", "CONTRACT.md", "NOTES.md"}
    assert not OUTSIDE.search("file:///shared/path and https://git-lfs.github.com/spec/v1")
