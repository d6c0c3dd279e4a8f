"""Every finding page ends with a '## Example' section, and its code is real.

A finding about the training code shows a minimal **Bad** script that raises the code and a
**Good** one that fixes it (Python blocks under those labels). A finding that is not about the
training code (torchdoctor's own failure, the environment, the driver, the nodes of a job, a
checkpoint file as it lies on disk) says so and shows the command or the file situation instead.
Every Python block parses; `torchdoctor explain CODE` renders the section.
"""

import ast
import re

import pytest
from typer.testing import CliRunner

from torchdoctor.catalog import catalog
from torchdoctor.docs import REQUIRED_HEADINGS, doc_path

CODES = sorted(catalog())
HEADING = "Example"

# Codes whose example is a command or a file situation, not a bad/good training script; their
# section starts with NOT_CODE_MARK.
NOT_TRAINING_CODE = {
    "internal-error",  # a torchdoctor bug
    "killed-by-signal",  # ended from outside (OOM killer, scheduler, native crash)
    # the machine, the driver, the launch environment
    "allreduce-bandwidth-low", "collective-selftest-failed", "dist-env-inconsistent",
    "gpu-memory-in-use", "inter-node-sockets", "nccl-env-risky", "nccl-unavailable",
    "torch-cpu-build-on-gpu-host",
    # the nodes of a multi-node job
    "node-env-mismatch", "node-lost", "node-never-joined", "node-summary-invalid",
    # a checkpoint file as it lies on disk
    "ckpt-unreadable", "ckpt-part-file", "ckpt-model-mismatch", "ckpt-optimizer-mismatch",
}
NOT_CODE_MARK = "Not about your training code"

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
LABEL = re.compile(r"^\*\*(Bad|Good)\*\*", re.M)


def section(text: str, heading: str) -> str | None:
    parts = re.split(rf"^## {re.escape(heading)}[ \t]*$", text, flags=re.M)
    if len(parts) != 2:
        return None
    return re.split(r"^## ", parts[1], maxsplit=1, flags=re.M)[0]


def blocks(text: str) -> list[tuple[str | None, str, str]]:
    """(label, language, code) of each fenced block; label: 'Bad'/'Good' when the paragraph just
    before the block (after the previous block) starts with **Bad** / **Good**, else None."""
    out, last = [], 0
    for m in FENCE.finditer(text):
        labels = LABEL.findall(text[last:m.start()])
        out.append((labels[-1] if labels else None, m.group(1), m.group(2)))
        last = m.end()
    return out


def example(code: str) -> str:
    text = doc_path(code).read_text()
    body = section(text, HEADING)
    assert body is not None, f"docs/findings/{code}.md: no single '## {HEADING}' section"
    return body


@pytest.mark.parametrize("code", CODES)
def test_every_page_ends_with_one_example_section(code):
    text = doc_path(code).read_text()
    headings = [h.strip() for h in re.findall(r"^## (.+)$", text, flags=re.M)]
    assert headings.count(HEADING) == 1, headings
    assert headings[-1] == HEADING and set(REQUIRED_HEADINGS) <= set(headings[:-1]), headings
    assert len(example(code).strip()) > 40


@pytest.mark.parametrize("code", CODES)
def test_every_python_block_parses(code):
    found = blocks(example(code))
    assert found, f"{code}: the example shows no code block"
    for label, lang, src in found:
        assert lang, f"{code}: a code block without a language"
        if lang == "python":
            ast.parse(src, filename=f"docs/findings/{code}.md ({label or 'block'})")
            # a line starting with '## ' would read as a heading to every section parser
            assert not re.search(r"^## ", src, flags=re.M), code


@pytest.mark.parametrize("code", sorted(set(CODES) - NOT_TRAINING_CODE))
def test_a_training_code_finding_has_a_bad_and_a_good_script(code):
    body = example(code)
    py = [(label, src) for label, lang, src in blocks(body) if lang == "python"]
    bad = [src for label, src in py if label == "Bad"]
    good = [src for label, src in py if label == "Good"]
    assert bad and good, f"{code}: needs a **Bad** and a **Good** python block, got {[lb for lb, _ in py]}"
    assert re.search(rf"^\*\*Bad\*\* \(raises `{re.escape(code)}`", body, flags=re.M), \
        f"{code}: the **Bad** label must say it raises `{code}`"
    assert all(b.strip() != g.strip() for b in bad for g in good), f"{code}: bad and good are the same"
    assert NOT_CODE_MARK not in body, f"{code}: a training-code example says it is not about code"


@pytest.mark.parametrize("code", sorted(NOT_TRAINING_CODE))
def test_a_finding_not_about_training_code_says_so(code):
    assert code in CODES, f"{code} is not a declared code"
    body = example(code).strip()
    assert body.startswith(NOT_CODE_MARK), f"{code}: the example must start with '{NOT_CODE_MARK}'"
    assert any(lang in ("console", "python") for _, lang, _ in blocks(body))


@pytest.mark.parametrize("code", ["memory-growth", "eval-mode-training", "internal-error"])
def test_explain_renders_the_example(code):
    from torchdoctor.cli import app

    res = CliRunner().invoke(app, ["explain", code], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    assert re.search(rf"^\s*{HEADING}\s*$", res.output, flags=re.M), res.output[-2000:]
    for _, _, src in blocks(example(code)):
        first = next(line for line in src.splitlines() if line.strip())
        assert first.strip() in res.output, (code, first)


def test_the_checks_catch_what_they_are_for():
    page = ("# x\n\n## References\n- r\n\n## Example\n\n**Bad** (raises `x`): no.\n\n```python\n"
            "a = [\n```\n\nsome words\n\n```console\n$ ls\n```\n\n**Good**: yes.\n\n```python\nb = 1\n```\n")
    body = section(page, HEADING)
    got = blocks(body)
    assert [(lb, lang) for lb, lang, _ in got] == [("Bad", "python"), (None, "console"), ("Good", "python")]
    with pytest.raises(SyntaxError):
        ast.parse(got[0][2])
    assert section("# x\n## Example\n## Example\n", HEADING) is None
    assert section("# x\n## What it means\n", HEADING) is None
