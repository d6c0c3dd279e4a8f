"""Compare a checkpoint's state_dict and optimizer state with a model (``--model``).

``load_model_spec`` is the only part that imports torch and runs code — the user's own
factory, by explicit request; the comparisons are pure functions over
``{key: (shape, dtype)}`` maps, so they are tested without torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.errors import DoctorError

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
WRAPPER_SEGMENTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
# optimizer per-parameter state that always has the parameter's shape
PARAM_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
                          "acc_delta", "sum", "grad_avg", "ax", "prev", "exp_inf", "mu_product"})


@dataclass
class ModelSpec:
    """What the comparison needs from a model: state_dict and parameters, as plain data."""

    source: str
    state: dict[str, tuple[tuple[int, ...], str]]  # state_dict key -> (shape, dtype)
    params: list[tuple[str, tuple[int, ...], bool]]  # named_parameters(): (name, shape, requires_grad)


@dataclass
class StateCompare:
    matched: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape: list[tuple[str, list, list]] = field(default_factory=list)  # (key, ckpt shape, model shape)
    dtype: list[tuple[str, str, str]] = field(default_factory=list)  # (key, ckpt dtype, model dtype)
    transform: str | None = None  # e.g. "strip 'module.'" when keys only fit after it
    matched_after: int = 0


def load_model_spec(spec: str) -> ModelSpec:
    """Import ``module:factory`` (or ``path/file.py:factory``), build the model, describe it."""
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise DoctorError(f"--model must be MODULE:FACTORY or FILE.py:FACTORY, not {spec!r}",
                          hint="e.g. --model mypkg.models:build_model  or  --model train.py:Net")
    try:
        import torch
    except ImportError as e:
        raise DoctorError(f"--model needs torch: {e}") from None
    if mod_name.endswith(".py") or os.sep in mod_name:
        if not os.path.isfile(mod_name):
            raise DoctorError(f"--model: no such file: {mod_name}")
        sys.path.insert(0, os.path.dirname(os.path.abspath(mod_name)))
        s = importlib.util.spec_from_file_location("_torchdoctor_model_module", mod_name)
        module = importlib.util.module_from_spec(s)
        try:
            s.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's module failing is their input's problem
            raise DoctorError(f"--model: importing {mod_name} raised {type(e).__name__}: {e}") from None
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except Exception as e:  # noqa: BLE001
            raise DoctorError(f"--model: cannot import {mod_name}: {type(e).__name__}: {e}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise DoctorError(f"--model: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, torch.nn.Module):
        if not callable(obj):
            raise DoctorError(f"--model: {attr} is neither an nn.Module nor callable")
        try:
            obj = obj()
        except Exception as e:  # noqa: BLE001
            raise DoctorError(f"--model: {attr}() raised {type(e).__name__}: {e}",
                              hint="the factory is called without arguments") from None
    if not isinstance(obj, torch.nn.Module):
        raise DoctorError(f"--model: {attr}() returned {type(obj).__name__}, not an nn.Module")
    state = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in obj.state_dict().items()
             if hasattr(v, "shape")}
    params = [(n, tuple(p.shape), bool(p.requires_grad)) for n, p in obj.named_parameters()]
    return ModelSpec(spec, state, params)


def _candidates(ckpt_keys: list[str], model_keys: list[str]) -> list[tuple[str, Any]]:
    """Key rewrites worth trying: strip/add a leading prefix, drop wrapper segments."""
    out: list[tuple[str, Any]] = []
    firsts = Counter(k.split(".", 1)[0] + "." for k in ckpt_keys if "." in k)
    for p, n in firsts.most_common(4):
        if n >= 0.5 * len(ckpt_keys):
            out.append((f"strip '{p}'", lambda k, p=p: k[len(p):] if k.startswith(p) else k))
    mfirsts = Counter(k.split(".", 1)[0] + "." for k in model_keys if "." in k)
    for p, n in mfirsts.most_common(2):
        if n >= 0.5 * len(model_keys) and not any(k.startswith(p) for k in ckpt_keys):
            out.append((f"add '{p}'", lambda k, p=p: p + k))
    for seg in WRAPPER_SEGMENTS:
        if any(seg in k for k in ckpt_keys):
            out.append((f"remove '{seg}' segments", lambda k, seg=seg: k.replace(seg, "")))
    return out


def compare_state(ckpt: dict[str, tuple[tuple, str]], model: dict[str, tuple[tuple, str]]) -> StateCompare:
    """Keys, shapes and dtypes of a checkpoint state_dict against a model's state_dict."""
    res = StateCompare()
    keys = list(ckpt)
    direct = sum(1 for k in keys if k in model)
    best_name, best_fn, best = None, None, direct
    for name, fn in _candidates(keys, list(model)):
        n = sum(1 for k in keys if fn(k) in model)
        if n > best:
            best_name, best_fn, best = name, fn, n
    mapped = {best_fn(k) if best_fn else k: k for k in keys}
    if best_fn is not None:
        res.transform, res.matched_after = best_name, best
    for mk, (mshape, mdtype) in model.items():
        ck = mapped.get(mk)
        if ck is None:
            res.missing.append(mk)
            continue
        cshape, cdtype = ckpt[ck]
        res.matched += 1
        if tuple(cshape) != tuple(mshape):
            res.shape.append((mk, list(cshape), list(mshape)))
        elif cdtype != mdtype:
            res.dtype.append((mk, cdtype, mdtype))
    res.unexpected = [ck for mk, ck in mapped.items() if mk not in model]
    return res


@dataclass
class OptimCompare:
    n_ids: int = 0  # parameters listed in param_groups
    n_params: int | None = None  # parameters the model (or checkpoint) has
    problems: list[str] = field(default_factory=list)  # certain mismatches
    notes: list[str] = field(default_factory=list)  # inconclusive observations


def _brief(v: Any) -> str:
    from torchdoctor.checkpoint.values import brief

    return brief(v, 80)


def _param_shaped(entry: Any) -> list[tuple]:
    from torchdoctor.checkpoint.values import TensorInfo

    if not isinstance(entry, dict):
        return []
    return [tuple(v.shape) for k, v in entry.items() if k in PARAM_SHAPED and isinstance(v, TensorInfo)]


def compare_optimizer(state: dict, ids: list, params: list[tuple[str, tuple]], exact_order: bool,
                      unique_params: int | None = None) -> OptimCompare:
    """Optimizer state vs. the parameters it should belong to.

    ``params``: (name, shape) in ``model.parameters()`` order when ``exact_order``,
    otherwise the checkpoint's floating tensors (buffers included, so only impossibilities
    are certain). Integer ids index ``params`` (torch's optimizer state_dict); string ids
    are parameter names (DCP / ``get_optimizer_state_dict``).
    """
    out = OptimCompare(n_ids=len(ids), n_params=unique_params if unique_params is not None else len(params))
    id_set = set(ids)
    dangling = [i for i in state if i not in id_set] if ids else []
    if dangling:
        out.problems.append(f"{len(dangling)} state entries belong to no param_group (first: {_brief(dangling[0])})")
    by_name = dict(params)
    if ids and all(isinstance(i, str) for i in ids):
        unknown = [i for i in ids if i not in by_name]
        if unknown:
            out.problems.append(f"{len(unknown)} parameter names are not in the model (first: {_brief(unknown[0])})")
        for name, entry in state.items():
            for shp in _param_shaped(entry):
                if name in by_name and tuple(by_name[name]) != shp:
                    out.problems.append(f"state of {name!r} has shape {list(shp)}, parameter has {list(by_name[name])}")
                    break
        return out
    if out.n_params is not None and len(ids) > out.n_params:
        out.problems.append(f"param_groups list {len(ids)} parameters, the model has {out.n_params}")
    if exact_order:
        for pos, pid in enumerate(ids):
            shapes = _param_shaped(state.get(pid))
            if pos < len(params) and shapes and any(s != tuple(params[pos][1]) for s in shapes):
                if len(ids) == len(params):
                    out.problems.append(f"parameter #{pos} ({params[pos][0]}): state shape {list(shapes[0])}, "
                                        f"parameter shape {list(params[pos][1])}")
                else:
                    out.notes.append("state shapes do not follow model.parameters() order (custom param groups "
                                     "or frozen parameters)")
                break
    available = Counter(tuple(s) for _n, s in params)
    needed = Counter(s for pid in ids for s in _param_shaped(state.get(pid))[:1])
    short = [s for s, n in needed.items() if n > available.get(s, 0)]
    if short:
        out.problems.append(f"optimizer state for {sum(needed[s] - available.get(s, 0) for s in short)} "
                            f"parameters has shapes no parameter has (e.g. {list(short[0])})")
    return out
