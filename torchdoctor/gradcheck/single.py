"""The driver of ``torchdoctor gradcheck FILE.py:Name --shape ...``, run as the child's target.

Imports FILE.py as a module (not as ``__main__``: a training block under
``if __name__ == "__main__":`` does not run), takes the class ``Name`` (dotted for a nested class),
and calls ``Name.apply`` once on random float64 inputs of the given shapes (seeded, all requiring
grad), then one backward with random output gradients. The capture instrument records that call
like any call of a training script and checks it after this driver returns. A backward that raises
here is not swallowed: it ends the driver as it would end a training script (``script-crashed``,
with the user's file:line, beside the check's classification: ``custom-function-bad-grad-return``),
never a "No problems found" on a Function whose backward cannot run.

Usage (by the command): ``python -m torchdoctor.gradcheck.single FILE NAME SHAPES_JSON``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys


def _load(path: str):
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else "gradcheck_target"
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"torchdoctor gradcheck: cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # pickling and dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    import torch

    path, name, shapes = argv[0], argv[1], json.loads(argv[2])
    obj = _load(path)
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise SystemExit(f"torchdoctor gradcheck: {path} defines no {name!r} at import")
    if not (isinstance(obj, type) and issubclass(obj, torch.autograd.Function)):
        raise SystemExit(f"torchdoctor gradcheck: {name} is not a torch.autograd.Function subclass")
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, dtype=torch.float64, generator=gen).requires_grad_(True) for s in shapes]
    out = obj.apply(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad]
    if not diff:
        print(f"torchdoctor gradcheck: no output of {name} requires grad", file=sys.stderr)
        return 0
    loss = sum((o * torch.randn(o.shape, dtype=o.dtype, generator=gen)).sum() for o in diff)
    loss.backward()  # one that raises is this call's crash, reported as a script's would be
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
