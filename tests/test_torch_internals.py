"""The facade for private torch APIs (torchdoctor/torch_internals.py): every private API the
package calls goes through it, so a torch upgrade touches one file; each accessor works on the
installed torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "torchdoctor"
# the profiler's privates have their own single place; the checkpoint reader only names torch's
# rebuild functions as strings of the pickle format (never calls them); errorkb quotes messages;
# the compile rules quote dynamo's settings in their fix texts (prose for the user, never called)
ALLOWED = {"rules/compile.py", "torch_internals.py", "instruments/profile/_profiler_compat.py", "checkpoint/allowlist.py",
           "checkpoint/stub_unpickler.py", "checkpoint/pickle_globals.py", "errortext/table.py",
           "envinfo/torchinfo.py"}
PRIVATE = re.compile(r"torch\._[A-Za-z]|\b_C\b|utils\._python_dispatch|_BaseDataLoaderIter|_local_tensor\b|"
                     r"_foreach_norm\b|\._next_data\b|cuda\.memory\._|cuda\._lazy_call|"
                     r"_dataset\b|_num_workers\b|_index_sampler\b")


def _code_lines(text: str):
    """(line number, code) without comments and docstrings (prose may name the APIs)."""
    import ast
    import io
    import tokenize

    skip = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) \
                and isinstance(node.value.value, str):
            skip.update(range(node.lineno, node.end_lineno + 1))
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE) or tok.start[0] in skip:
            continue
        if tok.type == tokenize.STRING and tok.start[0] not in skip:
            out[tok.start[0]] = out.get(tok.start[0], "") + " " + tok.string
            continue
        out[tok.start[0]] = out.get(tok.start[0], "") + " " + tok.string
    return out


def test_private_torch_apis_only_in_the_facade():
    bad = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel in ALLOWED:
            continue
        for n, code in _code_lines(p.read_text(encoding="utf-8")).items():
            joined = code.replace(" . ", ".").replace(" .", ".").replace(". ", ".")
            if PRIVATE.search(joined):
                bad.append(f"{rel}:{n}: {joined.strip()[:100]}")
    assert not bad, "private torch APIs outside torchdoctor/torch_internals.py:\n" + "\n".join(bad)


def test_scan_catches_a_private_call():
    src = "import torch\nx = torch._foreach_norm([t], 2)\n# torch._C in a comment\n"
    hits = [c for c in _code_lines(src).values()
            if PRIVATE.search(c.replace(" . ", ".").replace(" .", ".").replace(". ", "."))]
    assert len(hits) == 1


def test_facade_imports_no_torch():
    code = "import sys, torchdoctor.torch_internals; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_each_accessor_works_on_this_torch():
    import torch

    from torchdoctor import torch_internals as ti

    dl = torch.utils.data.DataLoader(list(range(10)), batch_size=4)
    it = iter(dl)
    assert isinstance(it, ti.base_loader_iter())
    facts = ti.loader_iter_facts(it)
    assert facts["num_workers"] == 0 and facts["batch_size"] == 4 and facts["dataset"] is dl.dataset
    assert callable(getattr(it, ti.NEXT_DATA))
    norms = ti.foreach_norm()([torch.ones(4), torch.zeros(2)], 2)
    assert [float(n) for n in norms] == [2.0, 0.0]
    set_grad = ti.set_grad_enabled_raw()
    prev = torch.is_grad_enabled()
    set_grad(False)
    assert not torch.is_grad_enabled()
    set_grad(prev)
    assert issubclass(ti.dispatch_mode_base(), object) and hasattr(ti.dispatch_mode_base(), "__torch_dispatch__")
    assert not ti.top_saved_tensors_hooks()
    pack = lambda t: t  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, pack):
        assert ti.top_saved_tensors_hooks()[0] is pack
    assert ti.cuda_memory_stats_raw() is None or callable(ti.cuda_memory_stats_raw())
