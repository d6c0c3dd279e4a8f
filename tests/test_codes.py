"""Meta-tests of the finding-code catalog and its docs."""

import re

import pytest

from torchdoctor.codes import SEVERITIES, catalog, declare
from torchdoctor.docs import REQUIRED_HEADINGS, doc_path
from torchdoctor.skills import ALL_SKILLS

CODES = sorted(catalog())


def test_catalog_is_not_empty_and_codes_are_kebab_case():
    assert CODES
    for code in CODES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", code), code


def test_declaring_a_code_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        declare(CODES[0], ALL_SKILLS[0], "error", "dup")


def test_every_code_has_valid_skill_and_severity():
    for info in catalog().values():
        assert info.skill in ALL_SKILLS
        assert info.severity in SEVERITIES
        assert info.docs == f"docs/findings/{info.code}.md"


@pytest.mark.parametrize("code", CODES)
def test_every_code_has_a_doc_page_with_the_house_headings(code):
    path = doc_path(code)
    assert path is not None, f"missing docs/findings/{code}.md"
    text = path.read_text()
    assert text.startswith(f"# {code}"), f"{path} must start with '# {code}'"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert [h.strip() for h in headings[: len(REQUIRED_HEADINGS)]] == list(REQUIRED_HEADINGS), headings
    for h in REQUIRED_HEADINGS:
        body = text.split(f"## {h}", 1)[1].split("\n## ", 1)[0].strip()
        assert len(body) > 20, f"{code}: section '{h}' is empty"


def test_every_doc_page_belongs_to_a_code():
    from torchdoctor.docs import code_pages, findings_dirs

    pages = {p.stem for p in code_pages(findings_dirs()[0])}  # README.md: the generated catalogue
    assert pages <= set(CODES), f"doc pages without a code: {sorted(pages - set(CODES))}"
