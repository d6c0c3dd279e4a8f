"""Meta-tests of the finding-code catalog, its docs, and what the rules need and raise."""

import importlib.util
import re
from pathlib import Path

import pytest

from torchdoctor.catalog import SEVERITIES, catalog, declare
from torchdoctor.docs import REQUIRED_HEADINGS, doc_path
from torchdoctor.judge import all_rules
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


# ---- thresholds: the page states each declared constant, with its value ----------------------

# a threshold line of a page's "How it is measured": - `NAME` = 0.30 (anything after the number
# is prose, e.g. "- `FRAG_MIN_GAP` = 268435456 (256 MiB)")
THRESHOLD_LINE = re.compile(r"^\s*[-*]\s+`([A-Z][A-Z0-9_]*)`\s*=\s*"
                            r"([-+]?(?:\d[\d_]*)(?:\.\d+)?(?:[eE][-+]?\d+)?)(?![\d.])", re.M)


def _section(text: str, heading: str) -> str:
    return text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def page_thresholds(code: str) -> dict[str, float]:
    text = doc_path(code).read_text()
    found: dict[str, float] = {}
    for name, value in THRESHOLD_LINE.findall(_section(text, "How it is measured")):
        assert name not in found, f"{code}: `{name}` stated twice"
        found[name] = float(value.replace("_", ""))
    return found


@pytest.mark.parametrize("code", CODES)
def test_the_page_states_exactly_the_declared_thresholds_with_their_values(code):
    declared = {k: float(v) for k, v in catalog()[code].thresholds.items()}
    stated = page_thresholds(code)
    assert sorted(stated) == sorted(declared), (
        f"docs/findings/{code}.md 'How it is measured' must state each threshold as "
        f"- `NAME` = value: missing {sorted(set(declared) - set(stated))}, "
        f"not declared {sorted(set(stated) - set(declared))}")
    for name, value in declared.items():
        assert stated[name] == pytest.approx(value, rel=1e-12, abs=0), (code, name)


def test_a_threshold_line_is_read_as_the_number_it_states():
    text = "- `DATA_SHARE` = 0.30 (30%)\n* `FRAG_MIN_GAP` = 268_435_456 (256 MiB)\n- `X` = 1e3x\n"
    assert THRESHOLD_LINE.findall(text) == [("DATA_SHARE", "0.30"), ("FRAG_MIN_GAP", "268_435_456"),
                                            ("X", "1e3")]
    assert THRESHOLD_LINE.findall("- `DATA_SHARE` = 0.3.1\n- `lower` = 1\n") == []


# ---- rules raise declared codes; every declared code is raised ------------------------------

# Codes raised outside any rule, with where:
RAISED_OUTSIDE_RULES = {
    "internal-error",  # the judge's guard (a crashing rule), a failed follow-up or instrument
    "ckpt-unreadable",  # checkpoint-audit, when the file cannot be read at all (no evidence)
}


def test_every_code_a_rule_raises_is_declared():
    for r in all_rules().values():
        assert r.raises, f"rule {r.name} declares no code it raises"
        assert r.raises <= set(CODES), (r.name, sorted(r.raises - set(CODES)))


def test_no_codes_package_left():
    # each code is declared once, in the rule module that raises it (issue 15)
    assert importlib.util.find_spec("torchdoctor.codes") is None


def test_every_declared_code_is_raised_by_a_rule_or_said_where():
    raised = set().union(*(r.raises for r in all_rules().values()))
    assert RAISED_OUTSIDE_RULES <= set(CODES)
    orphans = set(CODES) - raised - RAISED_OUTSIDE_RULES
    assert not orphans, f"declared but raised by no rule: {sorted(orphans)}"


# ---- needs: every kind a rule or a metrics provider reads is produced by something -----------

# kinds that no instrument produces: the harness core and step clock (runner/core.py,
# runner/cudaclock.py, runner/harness.py) and the parent's merge of a ranked run's rank folders
# (evidence/ranks.py)
CORE_KINDS = {"step", "step_device", "dataloader", "model", "env", "device", "script_start"}
PARENT_KINDS = {"rank_result", "rank_stacks"}


def _produced() -> set[str]:
    from torchdoctor.instruments import all_instruments

    made = set().union(*(c.produces for c in all_instruments().values()))
    return made | CORE_KINDS | PARENT_KINDS


def test_every_kind_a_rule_needs_is_produced():
    made = _produced()
    for r in all_rules().values():
        if r.probes & {"run", "checkup", "profile", "memory", "nan", "ranks"}:
            assert r.needs, f"script rule {r.name} declares no evidence it needs"
            assert r.needs <= made, (r.name, sorted(r.needs - made))


def test_every_kind_a_metrics_provider_or_a_follow_up_reads_is_produced():
    from torchdoctor.pipeline.registry import EXTRA_NEEDS, provider_needs

    made = _produced()
    for name, needs in provider_needs().items():
        assert needs and needs <= made, (name, sorted(needs - made))
    for probe, needs in EXTRA_NEEDS.items():
        assert needs <= made, (probe, sorted(needs - made))


def _kinds_read(module, fn_name: str) -> set[str]:
    """Evidence kinds that ``fn_name`` reads with ``.of/.last/.has("kind")``, itself or through
    the functions of its own module it calls (helpers in other modules are not followed)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    seen, kinds, todo = set(), set(), [fn_name]
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        for node in ast.walk(funcs[name]):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("of", "last", "has") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                kinds.add(node.args[0].value)
            elif isinstance(f, ast.Name):
                todo.append(f.id)
    return kinds


def test_a_rule_needs_every_kind_it_reads():
    """``needs`` arms the instruments: a kind read but not declared would go unmeasured and the
    rule would skip itself silently."""
    import sys

    for r in all_rules().values():
        read = _kinds_read(sys.modules[r.fn.__module__], r.fn.__name__)
        assert read <= r.needs, (r.name, sorted(read - r.needs))


def test_finding_takes_the_code_object():
    # issue 31: a rule may pass its declaration itself (no lookup through the catalogue)
    from torchdoctor.findings import finding

    info = catalog()["internal-error"]
    f = finding(info, "t", {"k": 1})
    assert (f.code, f.skill, f.severity, f.docs) == (info.code, info.skill, info.severity, info.docs)
    assert finding("internal-error", "t", {"k": 1}) == f
