"""The finding catalogue (docs/findings/README.md) is generated from the declarations and cannot rot."""

import subprocess
import sys

from torchdoctor.catalog import catalog
from torchdoctor.docs import CATALOGUE_PAGE, REGENERATE, catalogue_markdown, catalogue_path, code_pages, main


def test_committed_catalogue_equals_the_generated_one():
    path = catalogue_path()
    assert path.is_file(), f"missing {path}; generate it: {REGENERATE}"
    assert path.read_text() == catalogue_markdown(), f"{path} is stale; regenerate it: {REGENERATE}"


def test_catalogue_has_one_row_per_code_linking_its_page():
    text = catalogue_markdown()
    for code, info in catalog().items():
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| [`{code}`]({code}.md) |")), None)
        assert row is not None, code
        assert f"| {info.severity} |" in row
    assert text.count("\n| [`") == len(catalog())
    assert REGENERATE in text.splitlines()[1]  # the header comment says how to regenerate


def test_catalogue_is_not_a_code_page():
    pages = code_pages(catalogue_path().parent)
    assert CATALOGUE_PAGE not in {p.name for p in pages}
    assert {p.stem for p in pages} == set(catalog())


def test_check_flag_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    import torchdoctor.docs as docs

    stale = tmp_path / CATALOGUE_PAGE
    stale.write_text("# Finding codes\n")
    monkeypatch.setattr(docs, "catalogue_path", lambda: stale)
    assert main(["catalogue", "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    stale.write_text(catalogue_markdown())
    assert main(["catalogue", "--check"]) == 0
    assert main(["nonsense"]) == 2


def test_regenerate_command_prints_the_page():
    out = subprocess.run([sys.executable, "-m", "torchdoctor.docs", "catalogue"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out == catalogue_markdown()
