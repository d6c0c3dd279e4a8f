"""Recognise what each part of a checkpoint is for, from the shape of the data alone.

Key names vary between codebases (``model``/``state_dict``/``net``, ``optimizer``/``optim``),
so every role is recognised by its *form* first — an optimizer ``state_dict`` always has
``state`` + ``param_groups``; an LR scheduler's has ``last_epoch``; a GradScaler's has
``scale`` + ``growth_factor``; torch's CPU RNG state is a uint8 tensor of 5056 bytes —
and by key name only where the form is ambiguous (progress counters, config objects).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.checkpoint.values import NdArrayInfo, Opaque, TensorInfo, Unread, plain
from torchdoctor.checkpoint.walk import children, join, key_text

MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "net", "network", "module",
              "weights", "model_weights", "params", "generator", "policy", "backbone", "module_state_dict")
CONFIG_KEYS = frozenset({"config", "cfg", "args", "hparams", "hyper_parameters", "hyperparameters",
                         "training_args", "train_args", "opt", "opts", "options", "conf", "settings",
                         "training_args.bin", "config.json"})
CONFIG_CLASSES = ("argparse.Namespace", "omegaconf.", "transformers.training_args", "types.SimpleNamespace",
                  "ml_collections.", "easydict.", "addict.")
PROGRESS_RE = re.compile(
    r"^(cur_|curr_|current_|start_|global_|train_|completed_|finished_|last_|n_|num_)?"
    r"(epoch|step|steps_done|iter|iteration|it|update|updates|batch_idx|samples_seen|tokens_seen|"
    r"consumed_samples|consumed_train_samples|seen_samples)"
    r"(s_run|_run|_num|_count|_idx|_done)?$", re.I)  # nanoGPT iter_num, DDP tutorial EPOCHS_RUN
PROGRESS_CONTAINERS = frozenset({"progress", "trainer_state", "trainer_state.json", "loops", "state", "meta",
                                 "train_state", "training_state", "counters", "extra_state"})
MAX_MODULES = 100_000
WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
TORCH_RNG_BYTES = 5056  # sizeof CPUGeneratorImplState (mt19937): torch.get_rng_state().numel()
CUDA_RNG_BYTES = 16  # Philox seed + offset: torch.cuda.get_rng_state().numel()


@dataclass
class ModelRole:
    path: str  # where in the checkpoint ("" = the root)
    tensors: dict[str, TensorInfo]  # state_dict keys -> tensors
    full_pickle_class: str | None = None  # set when a pickled nn.Module was flattened


@dataclass
class OptimizerRole:
    path: str
    state: dict  # param id or name -> {"exp_avg": TensorInfo, "step": ...}
    param_groups: list[dict]
    param_ids: list  # every id/name listed in param_groups, in order

    @property
    def has_initial_lr(self) -> bool:
        return any(isinstance(g, dict) and "initial_lr" in g for g in self.param_groups)


@dataclass
class Roles:
    model: ModelRole | None = None
    extra_weights: list[ModelRole] = field(default_factory=list)
    optimizers: list[OptimizerRole] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    scalers: list[str] = field(default_factory=list)
    empty_scalers: list[str] = field(default_factory=list)  # GradScaler(enabled=False).state_dict() == {}
    rng: dict[str, str] = field(default_factory=dict)  # kind (torch, cuda, numpy, python) -> path
    progress: dict[str, Any] = field(default_factory=dict)  # path -> value
    config: list[str] = field(default_factory=list)
    full_modules: list[tuple[str, str]] = field(default_factory=list)  # (path, class)
    module_classes: set[str] = field(default_factory=set)  # classes of every pickled module and submodule
    fp16_signs: list[str] = field(default_factory=list)
    bf16_signs: list[str] = field(default_factory=list)
    role_of: dict[str, str] = field(default_factory=dict)  # path -> role, for the contents tree

    @property
    def training_state(self) -> list[str]:
        """Which training-state roles are present (what makes a checkpoint 'resumable')."""
        out = []
        if self.optimizers:
            out.append("optimizer")
        if self.schedulers:
            out.append("scheduler")
        if self.scalers:
            out.append("scaler")
        if self.rng:
            out.append("rng")
        if self.progress:
            out.append("progress")
        return out


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1] if path else ""


def _is_optimizer(v: Any) -> bool:
    return isinstance(v, dict) and "state" in v and "param_groups" in v and \
        isinstance(v["state"], (dict, list)) and isinstance(v["param_groups"], (list, dict))


def _is_scheduler(v: Any) -> bool:
    return isinstance(v, dict) and "last_epoch" in v and \
        any(k in v for k in ("base_lrs", "_last_lr", "_step_count", "_schedulers", "min_lrs", "lr_lambdas"))


def _is_scaler(v: Any) -> bool:
    return isinstance(v, dict) and (("scale" in v and "growth_factor" in v) or "loss_scale" in v or
                                    ("cur_scale" in v and "scale_factor" in v))


def _is_module(v: Any) -> bool:
    if not isinstance(v, Opaque):
        return False
    a = v.attrs
    return isinstance(a.get("_parameters"), dict) and isinstance(a.get("_modules"), dict)


def _state_dict_like(path: str, v: Any) -> bool:
    if not isinstance(v, dict) or not v:
        return False
    if any(_rng_kind(join(path, key_text(k)), x) for k, x in v.items()):
        return False  # a dict of RNG states ({"torch": uint8[5056], ...}), not weights
    n_t = sum(1 for x in v.values() if isinstance(x, TensorInfo))
    return n_t >= 1 and all(isinstance(k, str) for k in v) and n_t >= 0.9 * len(v)


def _rng_kind(path: str, v: Any) -> str | None:
    name = path.lower()
    if isinstance(v, TensorInfo) and v.dtype == "uint8" and len(v.shape) == 1:
        if v.shape[0] == TORCH_RNG_BYTES:
            return "torch"
        if v.shape[0] == CUDA_RNG_BYTES and ("cuda" in name or "rng" in name or "gpu" in name):
            return "cuda"
        if any(s in name for s in ("rng", "random", "generator")):
            return "cuda" if "cuda" in name or "gpu" in name else "torch"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, TensorInfo) and x.dtype == "uint8" and
                                                   x.shape == (CUDA_RNG_BYTES,) for x in v):
        return "cuda"
    if isinstance(v, tuple) and len(v) == 5 and v[0] == "MT19937" and isinstance(v[1], NdArrayInfo):
        return "numpy"
    if isinstance(v, dict) and isinstance(v.get("bit_generator"), str) and "state" in v:
        return "numpy"
    if isinstance(v, Opaque) and v.cls.startswith("numpy.random"):
        return "numpy"
    if isinstance(v, tuple) and len(v) == 3 and v[0] == 3 and isinstance(v[1], tuple) and len(v[1]) == 625:
        return "python"
    return None


def _progress_value(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, Unread):  # saved, but its data file is missing: ckpt-unreadable says so
        return True
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, TensorInfo) and v.numel == 1


def flatten_module(mod: Opaque, prefix: str = "", depth: int = 0, seen: set | None = None,
                   classes: set | None = None) -> dict[str, TensorInfo]:
    """The state_dict of a pickled nn.Module, rebuilt from its recorded attributes.

    A module reached twice (shared submodule, or a crafted cycle) is flattened once, as
    ``state_dict()`` itself does; so the walk is linear in the number of modules.
    """
    out: dict[str, TensorInfo] = {}
    seen = set() if seen is None else seen
    if depth > 64 or id(mod) in seen or len(seen) > MAX_MODULES:
        return out
    seen.add(id(mod))
    if classes is not None:
        classes.add(mod.cls)
    a = mod.attrs
    for name, t in (a.get("_parameters") or {}).items():
        if isinstance(t, TensorInfo):
            out[prefix + key_text(name)] = t
    skip = a.get("_non_persistent_buffers_set")
    skip = set(skip) if isinstance(skip, (set, frozenset, list, tuple)) else set()
    for name, t in (a.get("_buffers") or {}).items():
        if isinstance(t, TensorInfo) and name not in skip:
            out[prefix + key_text(name)] = t
    for name, child in (a.get("_modules") or {}).items():
        if _is_module(child):
            out.update(flatten_module(child, f"{prefix}{name}.", depth + 1, seen, classes))
    return out


def _optimizer(path: str, v: dict) -> OptimizerRole:
    groups = v["param_groups"]
    groups = list(groups.values()) if isinstance(groups, dict) else list(groups)
    state = v["state"]
    state = dict(enumerate(state)) if isinstance(state, list) else dict(state)
    ids: list = []
    for g in groups:
        if isinstance(g, dict) and isinstance(g.get("params"), (list, tuple)):
            ids.extend(i for i in g["params"] if isinstance(i, (int, str)))  # crafted: no unhashables
    if ids and all(isinstance(i, int) for i in ids) and all(isinstance(k, str) and k.isdigit() for k in state):
        state = {int(k): x for k, x in state.items()}  # DCP flattening turns int keys into strings
    return OptimizerRole(path, state, [g for g in groups if isinstance(g, dict)], ids)


def recognise(root: Any) -> Roles:
    """Walk the tree once and assign roles (see module docstring)."""
    r = Roles()
    claimed: set[int] = set()  # ids of nodes whose subtree belongs to a recognised role
    candidates: list[ModelRole] = []
    config_nodes: list[tuple[str, Any]] = []
    visited: set[int] = set()  # each container is judged once, however many paths reach it

    def visit(path: str, v: Any, depth: int) -> None:
        if isinstance(v, (dict, list, tuple, Opaque, TensorInfo)):
            if id(v) in visited:
                return
            visited.add(id(v))
        role = _classify(path, v, r, candidates)
        if role is not None:
            claimed.add(id(v))
            r.role_of[path] = role
            if role == "config":
                config_nodes.append((path, v))
            return
        if depth >= 7 or not isinstance(v, (dict, list, tuple, Opaque)):
            return
        for k, c in children(v):
            visit(join(path, k), c, depth + 1)

    visit("", root, 0)
    _progress(root, r, claimed)
    _choose_model(r, candidates)
    _precision_signs(root, r, claimed, config_nodes)
    return r


def _classify(path: str, v: Any, r: Roles, candidates: list[ModelRole]) -> str | None:
    if _is_optimizer(v):
        r.optimizers.append(_optimizer(path, v))
        return "optimizer"
    if isinstance(v, list) and v and all(_is_optimizer(x) for x in v):
        for i, x in enumerate(v):
            r.optimizers.append(_optimizer(join(path, str(i)), x))
        return "optimizer"
    if _is_scheduler(v) or (isinstance(v, list) and v and all(_is_scheduler(x) for x in v)):
        r.schedulers.append(path)
        return "scheduler"
    if _is_scaler(v):
        r.scalers.append(path)
        return "scaler"
    if isinstance(v, dict) and not v and "scaler" in _last(path).lower():
        r.empty_scalers.append(path)
        return "scaler (disabled)"
    if _is_module(v):
        r.full_modules.append((path, v.cls))
        candidates.append(ModelRole(path, flatten_module(v, classes=r.module_classes), full_pickle_class=v.cls))
        return "model (pickled nn.Module)"
    kind = _rng_kind(path, v)
    if kind is not None:
        r.rng.setdefault(kind, path)
        return f"rng ({kind})"
    if _state_dict_like(path, v):
        candidates.append(ModelRole(path, {key_text(k): t for k, t in v.items() if isinstance(t, TensorInfo)}))
        return "weights"
    if _is_config(path, v):
        r.config.append(path)
        return "config"
    return None


def _is_config(path: str, v: Any) -> bool:
    if isinstance(v, Opaque) and any(v.cls.startswith(c) for c in CONFIG_CLASSES):
        return True
    return _last(path).lower() in CONFIG_KEYS and isinstance(v, (dict, Opaque, str)) and path.count(".") <= 2


def _progress(root: Any, r: Roles, claimed: set[int]) -> None:
    seen: set[int] = set()

    def walk(obj: Any, prefix: str, depth: int) -> None:
        if depth > 3 or id(obj) in claimed or id(obj) in seen:
            return
        seen.add(id(obj))
        for k, v in children(obj):
            path = join(prefix, k)
            if id(v) in claimed:
                continue
            if PROGRESS_RE.match(k) and _progress_value(v):
                r.progress[path] = list(v.shape) if isinstance(v, TensorInfo) else plain(v)
                r.role_of.setdefault(path, "progress")
            elif isinstance(v, (dict, Opaque)) and (depth == 0 or k.lower() in PROGRESS_CONTAINERS or
                                                     k.lower().endswith("_state")):
                walk(v, path, depth + 1)

    walk(root, "", 0)


def _choose_model(r: Roles, candidates: list[ModelRole]) -> None:
    if not candidates:
        return

    def score(m: ModelRole) -> tuple:
        last = _last(m.path).lower()
        named = 3 if last in MODEL_KEYS else 2 if ("model" in last or "state_dict" in last) else \
            1 if m.path == "" else 0
        return (named, sum(t.nbytes for t in m.tensors.values()))

    ranked = sorted(candidates, key=score, reverse=True)
    r.model = ranked[0]
    r.role_of[r.model.path] = "model (pickled nn.Module)" if r.model.full_pickle_class else "model"
    r.extra_weights = ranked[1:]


_FP16_VALUES = {"fp16", "float16", "torch.float16", "half", "16", "16-mixed", "16-true", "o1", "o2", "o3"}
_BF16_VALUES = {"bf16", "bfloat16", "torch.bfloat16", "bf16-mixed", "bf16-true"}


def _precision_signs(root: Any, r: Roles, claimed: set[int], config_nodes: list[tuple[str, Any]]) -> None:
    """float16-training evidence: config flags, and float16 optimizer state."""
    amp_on: list[str] = []
    on_cpu: list[str] = []
    config_fp16: list[str] = []

    def look(path: str, v: Any) -> None:
        key = _last(path).lower()
        if isinstance(v, int) and not isinstance(v, bool):
            v = plain(v)
        if key in ("device", "device_type") and isinstance(v, str) and v.lower() == "cpu":
            on_cpu.append(path)  # float16 flags of a CPU run (nanoGPT's default dtype) start no GradScaler
        if isinstance(v, bool):
            if v and key in ("fp16", "half", "use_fp16"):
                config_fp16.append(f"{path}=True")
            elif v and key in ("bf16", "use_bf16"):
                r.bf16_signs.append(f"{path}=True")
            elif v and key in ("amp", "use_amp", "mixed_precision", "autocast"):
                amp_on.append(f"{path}=True")
        elif isinstance(v, (str, int)) and key in ("precision", "mixed_precision", "amp_dtype", "autocast_dtype",
                                                   "dtype", "fp16_opt_level", "amp_level", "half_precision"):
            s = str(v).lower()
            if s in _FP16_VALUES:
                config_fp16.append(f"{path}={v!r}")
            elif s in _BF16_VALUES:
                r.bf16_signs.append(f"{path}={v!r}")

    seen: set[int] = set()

    def walk(obj: Any, prefix: str, depth: int, max_depth: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for k, v in children(obj):
            path = join(prefix, k)
            if id(v) in claimed and prefix == "" and max_depth == 2:
                continue  # model/optimizer/config subtrees: configs are walked on their own
            look(path, v)
            if depth + 1 < max_depth and isinstance(v, (dict, Opaque, list, tuple)):
                walk(v, path, depth + 1, max_depth)

    for path, node in config_nodes:
        walk(node, path, 0, 5)
    if id(root) not in claimed:
        walk(root, "", 0, 2)
    if not on_cpu:
        r.fp16_signs.extend(config_fp16)
    if amp_on and not r.bf16_signs and not on_cpu:
        r.fp16_signs.extend(f"{s} (torch.autocast on CUDA defaults to float16)" for s in amp_on)
    for opt in r.optimizers:
        n16 = sum(1 for st in opt.state.values() if isinstance(st, dict)
                  for t in st.values() if isinstance(t, TensorInfo) and t.dtype == "float16" and t.numel > 1)
        if n16:
            r.fp16_signs.append(f"{opt.path or 'optimizer'}: {n16} optimizer-state tensors in float16")
