"""Crash context for ``device-mismatch``: which tensors and modules sit on which device.

At a crash (the crash rule keeps this only when the message says tensors are on different
devices: the classification is made in the parent), the innermost user frame's
locals are inspected (tensors, modules, and the tensor attributes of ``self``) together with
the root modules the step clock saw; the evidence names the tensors on each device and
points out plain tensor attributes (not buffers, so ``.to()`` does not move them) and
parameters left behind on another device. Costs nothing until a crash.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torchdoctor.instruments.base import Instrument, register

MAX_ITEMS = 8


def _dev(t: Any) -> str:
    return str(t.device)


def _desc(name: str, t: Any) -> str:
    return f"{name}: {_dev(t)} {str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _module_devices(m: Any) -> Counter:
    c: Counter = Counter()
    for p in m.parameters():
        c[_dev(p)] += 1
    for b in m.buffers():
        c[_dev(b)] += 1
    return c


def _odd_params(m: Any, majority: str) -> list[str]:
    out = []
    for n, p in list(m.named_parameters()) + list(m.named_buffers()):
        if _dev(p) != majority:
            out.append(f"{n}: {_dev(p)}")
            if len(out) >= MAX_ITEMS:
                break
    return out


def device_context(frame_locals: dict[str, Any], models: list[Any]) -> dict[str, Any]:
    import torch

    ev: dict[str, Any] = {}
    tensors = []
    plain_attrs = []
    for name, v in frame_locals.items():
        if isinstance(v, torch.Tensor):
            tensors.append(_desc(name, v))
        elif isinstance(v, torch.nn.Module) and name == "self":
            registered = set(dict(v.named_buffers(recurse=False))) | set(
                dict(v.named_parameters(recurse=False)))
            for an, av in vars(v).items():
                if isinstance(av, torch.Tensor) and an not in registered and not an.startswith("_"):
                    plain_attrs.append(f"self.{an}: {_dev(av)} (plain attribute: not a buffer, "
                                       f".to() does not move it)")
    if tensors:
        ev["tensors_at_crash"] = tensors[:MAX_ITEMS]
    if plain_attrs:
        ev["unregistered_tensors"] = plain_attrs[:MAX_ITEMS]
    mods = []
    for m in models:
        c = _module_devices(m)
        if not c:
            continue
        majority = c.most_common(1)[0][0]
        desc = f"{type(m).__name__}: " + ", ".join(f"{d} ({n} tensors)" for d, n in c.items())
        mods.append(desc)
        if len(c) > 1:
            ev.setdefault("left_behind", []).extend(
                f"{type(m).__name__}.{x}" for x in _odd_params(m, majority))
    if mods:
        ev["model_devices"] = mods[:MAX_ITEMS]
    return ev


@register
class CrashContext(Instrument):
    name = "crashctx"
    produces = frozenset({"crash_context"})
    priority = 90

    def on_crash(self, ctx: Any, exc: BaseException) -> None:
        # measured at every crash (the child does not judge what the crash was): the crash
        # rule keeps it for a device-mismatch crash, in the parent
        from torchdoctor.runner.frames import is_user_file

        tb = exc.__traceback__
        user = None
        while tb is not None:
            if is_user_file(tb.tb_frame.f_code.co_filename):
                user = tb.tb_frame
            tb = tb.tb_next
        ev = device_context(dict(user.f_locals) if user is not None else {}, ctx.models())
        fixes = []
        if ev.get("unregistered_tensors"):
            fixes.append("Register the tensor attributes named above with "
                         "self.register_buffer(name, tensor) so model.to(device) moves them")
        if ev.get("left_behind"):
            fixes.append("Move the model after every submodule and parameter is created (the "
                         "listed ones were added after model.to(device))")
        if ev:
            ctx.emit("crash_context", source=self.name, for_code="device-mismatch", evidence=ev,
                     fixes=fixes)
