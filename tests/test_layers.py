"""Architecture checks on the package's source (no torch, no subprocess).

* Instruments only measure: nothing in ``torchdoctor/instruments/`` or ``torchdoctor/runner/``
  (the code that runs inside the user's training process) imports the judgement or rendering
  side (rules, the judge, the catalogue, findings, the pipeline, the report, the CLI). What a
  crash was and which fixes come first are decided in the parent.
* Modules stay small: none is over ``MAX_LINES`` lines except the data tables listed.
* No import cycles among the package's modules, function-level imports included, and imports run
  down the ``FLOORS`` (at most ``MAX_UP`` exceptions, each listed with its reason).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "torchdoctor"

# the judgement / rendering side of the house, never imported by code that runs in the child
JUDGEMENT = ("torchdoctor.rules", "torchdoctor.judge", "torchdoctor.catalog", "torchdoctor.codes",
             "torchdoctor.findings", "torchdoctor.pipeline", "torchdoctor.report",
             "torchdoctor.commands", "torchdoctor.cli", "torchdoctor.main", "torchdoctor.triage",
             "torchdoctor.skills", "torchdoctor.evidence")
MEASURING = ("instruments", "runner")

MAX_LINES = 400
# data tables: long because they are lists of entries, not because they mix jobs
DATA_TABLES = {"errortext/table.py"}
# modules being split by another helper of issue 15 in parallel: the lead empties this list
# at merge (each entry must then be under MAX_LINES, or be a data table)
IN_PROGRESS: set[str] = set()


def _imported(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (write the full name)")
    return out


def _judgement(name: str) -> bool:
    return any(name == j or name.startswith(j + ".") for j in JUDGEMENT)


def test_scan_sees_a_judgement_import():
    # the scan itself: a module importing the crash rule is caught, a memory helper is not
    src = "from torchdoctor.rules.crash import classify\nfrom torchdoctor.memory import cuda\n"
    tree_names = [n for _, n in _imported_src(src)]
    assert [n for n in tree_names if _judgement(n)] == ["torchdoctor.rules.crash",
                                                        "torchdoctor.rules.crash.classify"]
    assert not _judgement("torchdoctor.rulesx") and _judgement("torchdoctor.report.console")
    assert not _judgement("torchdoctor.safe")  # escaping untrusted text is for everyone


def _imported_src(src: str) -> list[tuple[int, str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.py"
        p.write_text(src)
        return _imported(p)


@pytest.mark.parametrize("part", MEASURING)
def test_measuring_side_imports_no_judgement(part):
    bad = [f"{p.relative_to(PKG)}:{line}: {name}"
           for p in sorted((PKG / part).rglob("*.py")) for line, name in _imported(p)
           if _judgement(name)]
    assert not bad, "instruments only measure; the judgement side is imported at:\n" + "\n".join(bad)


def _line_counts() -> dict[str, int]:
    return {p.relative_to(PKG).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(PKG.rglob("*.py"))}


def test_no_module_over_max_lines():
    counts = _line_counts()
    big = {m: n for m, n in counts.items()
           if n > MAX_LINES and m not in DATA_TABLES and m not in IN_PROGRESS}
    assert not big, f"modules over {MAX_LINES} lines (split them by job): {big}"


def test_exception_lists_are_current():
    counts = _line_counts()
    assert all(m in counts for m in DATA_TABLES | IN_PROGRESS), "a listed module no longer exists"
    done = sorted(m for m in IN_PROGRESS if counts[m] <= MAX_LINES)
    assert not done, f"split already: take them off IN_PROGRESS: {done}"


# ---- the import graph: no cycles, floors that imports only run down ------------------------------
#
# Every ``import torchdoctor...`` / ``from torchdoctor... import ...`` in the package is an edge,
# at module level or inside a function alike (a function-level import is still a dependency; it
# only moves the moment it bites). ``from pkg import name`` points at ``pkg.name`` when that is a
# module, else at ``pkg`` (its ``__init__``). Plug-in discovery (``discovery.import_submodules``)
# is by name at run time and is not an edge.

def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_targets(path: Path) -> list[str]:
    """Dotted names an ``.py`` file imports: ``import a.b`` gives ``a.b``, ``from a import b``
    gives ``a.b`` (the module ``a.b``, or the name ``b`` of module ``a``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, for every ``.py`` file under ``root``."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    top = root.name

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        out: set[str] = set()
        for name in _import_targets(path):
            if name == top or name.startswith(top + "."):
                target = resolve(name)
                if target and target != mod:
                    out.add(target)
        graph[mod] = out
    return graph


@functools.cache
def _package_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(t) for m, t in import_graph().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _write_pkg(root: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        p = root / "pkgx" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    return root / "pkgx"


def test_scan_catches_a_cycle_hidden_in_a_function(tmp_path):
    pkg = _write_pkg(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkgx.b import f\n",
        "b.py": "def f():\n    from pkgx.sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "import pkgx.a\n",
        "d.py": "from pkgx import a\nfrom pkgx.sub import c\n",
    })
    g = import_graph(pkg)
    assert g["pkgx.d"] == {"pkgx.a", "pkgx.sub.c"} and g["pkgx.b"] == {"pkgx.sub.c"}
    assert cycles(g) == [["pkgx.a", "pkgx.b", "pkgx.sub.c"]]
    (pkg / "sub" / "c.py").write_text("import json\n")
    assert cycles(import_graph(pkg)) == []


def test_floor_scan_catches_an_upward_import(tmp_path):
    pkg = _write_pkg(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from pkgx.high import g\n",
        "high.py": "import pkgx.low\n",
        "plug/__init__.py": "",
        "plug/one.py": "import pkgx.high\n",
    })
    floors = [("low", ("pkgx", "pkgx.low")), ("high", ("pkgx.high",)), ("plugins", ("pkgx.plug",))]
    g = import_graph(pkg)
    # the function-level import counts; an import of the empty plug-in package from below does not
    g["pkgx.low"].add("pkgx.plug")
    assert upward(g, floors) == [("pkgx.low", "pkgx.high")]
    with pytest.raises(AssertionError, match="on no floor"):
        floor_of("elsewhere.mod", floors)


def test_no_import_cycles():
    found = [c for c in cycles(_package_graph()) if c not in KNOWN_CYCLES]
    assert not found, "import cycles among the package's modules (move the shared part down):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


# ---- floors: an import runs down (or across one floor), never up ----------------------------------
# Bottom first. A module sits on the floor of the longest prefix listed; rooms that hold both a
# low part and a high part list the parts by name.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("base: no torchdoctor imports, or only each other", (
        "torchdoctor", "torchdoctor.errors", "torchdoctor.discovery", "torchdoctor.skills",
        "torchdoctor.torch_internals", "torchdoctor.examples", "torchdoctor.perf", "torchdoctor.safe",
        "torchdoctor.version",
        "torchdoctor.report.caps")),
    ("tables and facts: error texts, environment facts, pure text readers", (
        "torchdoctor.errortext", "torchdoctor.envinfo", "torchdoctor.gradcheck",
        "torchdoctor.compilecheck.text")),
    ("measuring: the child (runner, instruments) and the readers of checkpoints and ranks", (
        "torchdoctor.runner", "torchdoctor.instruments", "torchdoctor.memory", "torchdoctor.numerics",
        "torchdoctor.checkpoint", "torchdoctor.distributed",
        "torchdoctor.treat.child", "torchdoctor.treat.survey", "torchdoctor.treat.backend",
        "torchdoctor.treat.data", "torchdoctor.treat.model", "torchdoctor.treat.optim",
        "torchdoctor.treat.precision", "torchdoctor.treat.catalogue", "torchdoctor.treat.dist",
        "torchdoctor.treat.dist_survey")),
    ("evidence: what a run measured, and the views derived from it that rules and metrics read", (
        "torchdoctor.evidence", "torchdoctor.attach.views", "torchdoctor.compilecheck.summary",
        "torchdoctor.distributed.stragglers")),
    ("the judge core: the catalogue, the report model, the rule contract", (
        "torchdoctor.catalog", "torchdoctor.findings", "torchdoctor.judge")),
    ("another node's summary, vetted against the catalogue (the cross-node rules read it)", (
        "torchdoctor.distributed.peer", "torchdoctor.distributed.gather")),
    ("rules", ("torchdoctor.rules",)),
    ("pipelines and rendering: evidence to report, report to text (every command's report is built "
     "in torchdoctor.pipeline: script probes, ranks and nodes, checkpoint, dist, env)", (
        "torchdoctor.pipeline", "torchdoctor.report",
        "torchdoctor.distributed.jobreport", "torchdoctor.distributed.ranked", "torchdoctor.schema")),
    ("features built on pipelines", (
        "torchdoctor.attach", "torchdoctor.treat", "torchdoctor.trials", "torchdoctor.reprocheck",
        "torchdoctor.compilecheck", "torchdoctor.triage", "torchdoctor.docs",
        "torchdoctor.compare")),
    ("commands", ("torchdoctor.commands", "torchdoctor.config")),
    ("the command line and the Python API", ("torchdoctor.cli", "torchdoctor.main", "torchdoctor.__main__",
                                             "torchdoctor.api")),
]

# the imports that run up, each with why it stays (at most MAX_UP)
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("torchdoctor", "torchdoctor.api"):
        "`torchdoctor.checkup(...)` and the other API names resolve on first use (module "
        "__getattr__), so `import torchdoctor` stays light and the API lives with the CLI",
    ("torchdoctor.rules.misplaced", "torchdoctor.cli"):
        "the rule that spots torchdoctor's options written after the script reads the option names "
        "from the typer app itself (one source, with a fallback list), lazily",
    ("torchdoctor.triage.handoff", "torchdoctor.cli"):
        "`ask ... --run` runs the probe of the first route through the command line itself, so its "
        "options are parsed exactly as when typed",
    ("torchdoctor.triage.handoff", "torchdoctor.commands._common"):
        "... and attaches the route to the report that command emits (ATTACHED_METRICS)",
}
MAX_UP = 5
# cycles and upward imports being broken by issue 31 (this list only shrinks; empty at its end)
KNOWN_CYCLES: list[list[str]] = []
TO_FIX: set[tuple[str, str]] = set()


def floor_of(module: str, floors=FLOORS) -> int:
    table = {p: i for i, (_, prefixes) in enumerate(floors) for p in prefixes}
    name = module
    while name not in table:
        if "." not in name:
            raise AssertionError(f"{module}: on no floor (add it to FLOORS)")
        name = name.rpartition(".")[0]
    return table[name]


def upward(graph: dict[str, set[str]], floors=FLOORS) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module sits on a higher floor. An empty package
    ``__init__`` (no imports of its own: a namespace or a discovery anchor) is on every floor."""
    return sorted((a, t) for a in graph for t in graph[a]
                  if floor_of(t, floors) > floor_of(a, floors) and not _anchor(t, graph))


def _is_package(name: str, graph) -> bool:
    return any(m.startswith(name + ".") for m in graph)


def _anchor(name: str, graph) -> bool:
    return _is_package(name, graph) and not graph.get(name)


def test_imports_run_down_the_floors():
    up = upward(_package_graph())
    unexplained = [f"{a} -> {t}" for a, t in up if (a, t) not in ALLOWED_UP and (a, t) not in TO_FIX]
    assert not unexplained, "imports running up the floors (move the shared part down):\n" + \
        "\n".join(unexplained)
    assert len(ALLOWED_UP) <= MAX_UP, f"more than {MAX_UP} allowed upward imports"


def test_layer_lists_are_current():
    g = _package_graph()
    up = set(upward(g))
    stale = sorted(k for k in set(ALLOWED_UP) | TO_FIX if k not in up)
    assert not stale, f"no longer upward (take them off ALLOWED_UP / TO_FIX): {stale}"
    gone = [c for c in KNOWN_CYCLES if c not in cycles(g)]
    assert not gone, f"no longer a cycle (take it off KNOWN_CYCLES): {gone}"
    for module in g:
        floor_of(module)


def test_rules_and_metrics_share_views_not_each_other():
    # derived views of the evidence live in torchdoctor/evidence/: the rules read them and so do
    # the metrics providers, so no rule imports the pipeline and no metrics module imports a rule
    g = _package_graph()
    bad = [f"{a} -> {t}" for a, targets in g.items() for t in targets
           if a.startswith("torchdoctor.rules.") and t.startswith("torchdoctor.pipeline")
           or a.startswith("torchdoctor.pipeline.") and a.endswith("_metrics")
           and t.startswith("torchdoctor.rules")]
    assert not bad, "move the shared view into torchdoctor/evidence/:\n" + "\n".join(bad)
