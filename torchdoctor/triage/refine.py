"""Where an error was raised can change whose problem it is.

The same PyTorch text means different things in different places: "modified by an inplace
operation" raised while a custom ``autograd.Function``'s ``backward`` reads ``ctx.saved_tensors`` is
that Function's bug (it saved a tensor that something then changed in place), not a generic
debugging hunt; "a leaf Variable that requires grad is being used in an in-place operation" raised
in a weight-init function is a module-design question (initialise under ``torch.no_grad()`` or with
``nn.init``). Each ``Refinement`` names the known entry it refines, the evidence it needs (read
from the traceback's frames, or from code pasted with the error) and the entry that replaces it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

from torchdoctor.errortext.table import BY_ID, Known
from torchdoctor.triage.logscan import Frame, Hit, Scan, user_frame
from torchdoctor.triage.symptoms import AG, DBG, MOD

FUNCTION_APPLY = "/autograd/function.py"  # the frame through which autograd calls a custom backward
_FUNCTION_CLASS = r"\bclass\s+(\w{1,100})\s*\(\s*(?:torch\.)?(?:autograd\.)?Function\s*\)"
_DEF = r"\bdef\s+(\w{1,100})\s*\("
_INIT_FN = r"init|reset_param"  # init_weights, _init_weights, weights_init, initialize, reset_parameters
CODE_SCAN = 20_000  # characters of pasted code searched for a class or def


@dataclass(frozen=True)
class Refinement:
    refines: str  # errortext row id
    id: str
    skill: str
    title: str
    explain: str
    first: str
    then: tuple[str, ...]
    evidence: Callable[[Frame | None, list[Frame], str], str | None]  # -> "why" words, or None

    def entry(self) -> Known:
        return dataclasses.replace(BY_ID[self.refines], id=self.id, skill=self.skill, title=self.title,
                                   explain=self.explain, first=self.first, then=self.then)


def _in_custom_backward(frame: Frame | None, frames: list[Frame], text: str) -> str | None:
    """The user's ``backward`` called by autograd's Function.apply (the frames nearer the error than
    that apply frame), or, without it, the nearest user frame is a ``backward`` reading ``ctx.``."""
    apply_at = next((k for k, f in enumerate(frames) if FUNCTION_APPLY in f.file.replace("\\", "/")), None)
    if apply_at is not None:
        found = next((f for f in frames[:apply_at] if f.user and f.fn == "backward"), None)
    else:
        found = frame if frame is not None and frame.fn == "backward" and "ctx." in frame.code else None
    if found is not None:
        return f"raised in backward() of a custom autograd.Function ({found.where})"
    code = text[:CODE_SCAN]
    cls = re.search(_FUNCTION_CLASS, code)
    if cls and re.search(r"\bdef\s+backward\s*\(\s*ctx\b", code):
        return f"pasted with a custom autograd.Function ({cls.group(1)}) and its backward"
    return None


def _is_init_name(name: str) -> bool:
    return name == "__init__" or bool(re.search(_INIT_FN, name.lower()))


def _in_weight_init(frame: Frame | None, frames: list[Frame], text: str) -> str | None:
    if frame is not None:
        if _is_init_name(frame.fn):
            return f"raised in the weight-init function {frame.fn}() ({frame.where})"
        return None  # the traceback says where: elsewhere
    for m in re.finditer(_DEF, text[:CODE_SCAN]):
        if _is_init_name(m.group(1)) and m.group(1) != "__init__":
            return f"pasted with the weight-init function {m.group(1)}()"
    return None


REFINEMENTS: tuple[Refinement, ...] = (
    Refinement(
        "inplace-modified", "inplace-modified-custom-function", AG,
        "a tensor saved by a custom autograd.Function was modified in place",
        "The custom Function's backward reads a tensor it saved with `ctx.save_for_backward`, and that "
        "tensor was changed in place after forward saved it (by the forward itself, or by code that "
        "modifies the Function's output or input, e.g. `y.add_(...)`, `relu_`, `x[...] = ...`).",
        "In forward, save what backward needs before any in-place op on it (or clone it, or use the "
        "out-of-place op after `.apply`); then check the Function on its real inputs with "
        "`torchdoctor gradcheck SCRIPT` (torch.autograd.gradcheck in float64).",
        (DBG,), _in_custom_backward),
    Refinement(
        "leaf-inplace", "leaf-inplace-weight-init", MOD,
        "weight initialisation modifies parameters in place while autograd tracks them",
        "A weight-init function changed a parameter in place (`fill_`, `normal_`, `zero_`, `copy_`) "
        "while autograd records operations on it; parameters are leaves that require grad.",
        "Initialise with `torch.nn.init` (`nn.init.normal_(m.weight, 0.0, 0.02)`, `nn.init.zeros_`), "
        "which work under no_grad, or wrap the function's body in `with torch.no_grad():`; apply it "
        "with `model.apply(init_fn)` before building the optimizer.",
        (DBG,), _in_weight_init),
)
_BY_REFINED = {r.refines: r for r in REFINEMENTS}


def refine(hit: Hit | None, sc: Scan, text: str) -> tuple[Known, str] | None:
    """The refined entry for ``hit`` and the evidence, when where it was raised says whose it is."""
    if hit is None or hit.entry is None or sc.text is None:
        return None
    r = _BY_REFINED.get(hit.entry.id)
    if r is None:
        return None
    i = hit.index
    frame = user_frame(sc.text, i) if i is not None else None
    frames = list(sc.text.frames_above(i)) if i is not None else []
    why = r.evidence(frame, frames, text)
    return (r.entry(), why) if why else None
