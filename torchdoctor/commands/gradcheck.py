"""``torchdoctor gradcheck SCRIPT``: check every custom autograd Function on the calls it really got.

Also ``torchdoctor gradcheck FILE.py:FunctionName --shape 4,8 [--shape ...]``: one Function on
random float64 inputs of the given shapes, without a training script. FILE.py is imported (its
module code runs, as ``python -c "import FILE"`` would: the user asked for it) only in the child
process; here it is only parsed (``ast``) to check that the class exists and takes that many inputs.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import typer

from torchdoctor.commands._script import ExtraOption, Resolved, script_command
from torchdoctor.errors import DoctorError

HELP = ("Run SCRIPT for a few steps, capture real calls of every custom torch.autograd.Function "
        "and check each in float64 on copies: gradients against finite differences "
        "(torch.autograd.gradcheck on small sub-problems), double backward where supported, "
        "wrong returned gradients, inputs modified in place without mark_dirty, tensors kept as "
        "ctx attributes. Or FILE.py:FunctionName --shape 4,8 ... to check one Function on random "
        "inputs.")
DRIVER = "torchdoctor.gradcheck.single"
MAX_ELEMENTS = 1_000_000  # per --shape input
# FILE.py of FILE.py:Name is parsed here: a larger file is refused before a byte is read (the
# largest .py in torch 2.13, common_methods_invocations.py, is 1.3 MiB and parses in ~2 s on the
# 2-core box; a 2 GiB sparse file took 2.1 GB and 11 s before this bound)
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def register(app: typer.Typer) -> None:
    script_command(app, "gradcheck", HELP, probe="gradcheck", steps_default=10, extra_options=[
        ExtraOption("samples", "--samples", int, 3,
                    "Real calls kept and checked per Function (distinct input shapes preferred).",
                    "N", min=1),
        ExtraOption("budget", "--budget", float, 60.0,
                    "Seconds for all the checks after the run (within --timeout).", "SECONDS", min=1),
        ExtraOption("shape", "--shape", list[str], None,
                    "With FILE.py:FunctionName: the shape of one input, e.g. 4,8 (repeat per "
                    "input; '' for a 0-dim tensor).", "D,D,..."),
    ], resolve_target=resolve)


def resolve(target: str, module: bool, args: list[str], options: dict[str, Any]) -> Resolved | None:
    shapes = options.pop("shape", None)
    file, sep, name = target.rpartition(":")
    if module or not sep or not file.endswith(".py"):
        if shapes:
            raise DoctorError("--shape is for one Function: torchdoctor gradcheck FILE.py:Name --shape 4,8",
                              hint="with a training script the real calls' inputs are checked")
        return None
    shapes = list(shapes or []) + _shape_args(target, args)
    path = Path(file)
    if not path.is_file():
        raise DoctorError(f"file not found: {file}")
    cls = _find_class(path, name)
    dims = [parse_shape(s) for s in (shapes or [])]
    need, most = _forward_arity(cls)
    if not dims:
        raise DoctorError(f"{name}.forward takes {need} input(s): give each one's shape with --shape",
                          hint=f"torchdoctor gradcheck {target} " + " ".join(["--shape 4,8"] * max(1, need)))
    if len(dims) < need or (most is not None and len(dims) > most):
        want = f"{need}" if most == need else f"{need} to {most}" if most is not None else f"at least {need}"
        raise DoctorError(f"{name}.forward takes {want} input(s), got {len(dims)} --shape")
    shown = f"{file}:{name} " + " ".join(f"--shape {','.join(map(str, d))}" for d in dims)

    def post(report) -> None:  # one Function on random inputs: there is no training loop to judge
        report.findings[:] = [f for f in report.findings if f.code != "no-training-steps"]
        report.metrics.pop("steps", None)

    return Resolved(DRIVER, True, [str(path.resolve()), name, json.dumps(dims)], shown.strip(), post)


def _shape_args(target: str, args: list[str]) -> list[str]:
    """The ``--shape X`` / ``--shape=X`` given after FILE.py:Name (parsing stops at the target)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--shape" and i + 1 < len(args):
            out.append(args[i + 1])
            i += 2
        elif a.startswith("--shape="):
            out.append(a.split("=", 1)[1])
            i += 1
        else:
            raise DoctorError(f"unexpected argument after {target}: {a}",
                              hint="only --shape D,D,... may follow FILE.py:Name; other options go before it")
    return out


def parse_shape(text: str) -> list[int]:
    t = text.strip().strip("()[]").replace("x", ",").replace(" ", "")
    if t in ("", "scalar"):
        return []
    try:
        dims = [int(x) for x in t.split(",") if x != ""]
    except ValueError:
        raise DoctorError(f"not a shape: {text!r}", hint="--shape 4,8 (comma-separated sizes)") from None
    if any(d < 1 for d in dims):
        raise DoctorError(f"not a shape: {text!r} (sizes must be >= 1)")
    n = 1
    for d in dims:
        n *= d
    if n > MAX_ELEMENTS:
        raise DoctorError(f"--shape {text} has {n} elements, over {MAX_ELEMENTS}",
                          hint="a few hundred elements check a backward as well as millions")
    return dims


def read_source(path: Path) -> bytes:
    """The bytes of ``path``, refused (exit 2) over :data:`MAX_SOURCE_BYTES`: the size is checked
    before reading, and the read itself stops one byte past the bound (a file that grows, or one
    whose size the file system does not know)."""
    too_big = DoctorError(f"{path} is over {MAX_SOURCE_BYTES // (1024 * 1024)} MiB: not a Python source file "
                          "to parse", hint="give the .py file that defines the Function")
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            raise too_big
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as e:
        raise DoctorError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise too_big
    return data


def _find_class(path: Path, name: str) -> ast.ClassDef:
    source = read_source(path)
    try:
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError) as e:
        raise DoctorError(f"cannot parse {path}: {type(e).__name__}") from None
    body: list = tree.body
    node = None
    for part in name.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            break
        body = node.body
    if node is None or not name.replace(".", "").replace("_", "a").isalnum():
        seen = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                and any("Function" in ast.unparse(b) for b in n.bases)]
        raise DoctorError(f"no class {name!r} in {path}",
                          hint=("Functions there: " + ", ".join(seen[:12])) if seen else
                          "give the name of a torch.autograd.Function subclass defined in the file")
    return node


def _forward_arity(cls: ast.ClassDef) -> tuple[int, int | None]:
    """(required inputs, most inputs or None for *args) of ``forward``, ctx not counted."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    fwd = methods.get("forward")
    if fwd is None:
        return 1, None  # inherited: let the child tell
    params = [*fwd.args.posonlyargs, *fwd.args.args]
    if "setup_context" not in methods and params:
        params = params[1:]  # ctx
    need = len(params) - len(fwd.args.defaults)
    return max(0, need), (None if fwd.args.vararg else len(params))
