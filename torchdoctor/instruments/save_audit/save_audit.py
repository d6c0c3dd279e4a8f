"""Save audit: what the script's own ``torch.save`` calls hold, against the live training objects.

Wrapped (module attributes, through :class:`~torchdoctor.runner.patching.Patches`, so a
``from torch import save`` written after start-up goes through the wrapper too):
``torch.save`` and ``torch.serialization.save``; ``safetensors.torch.save_file`` and
``save_model`` when safetensors is installed (imported at install for that: a script that
imports it later still gets the wrapped function). Constructors of LR schedulers and
GradScalers are wrapped to know the live ones (``save_audit_live.py``).

At a save in the owner process the saved object is described (``save_audit_describe.py``:
one bounded walk into the checkpoint reader's value model, the checkpoint family's role
recogniser, a match of every live model and optimizer) *before* the original save runs with
the very same arguments: the object is only read — never pickled, copied or changed by the
description — and what is saved is exactly what would be saved without torchdoctor. A failure
of the description is reported once (``instrument_error``) and the save goes on.

Cost: nothing per step; per save one walk of the saved object (``describe_ms`` in the event),
for the first ``MAX_PER_SITE`` saves of each call site and at most ``MAX_DESCRIBED`` per run;
later saves, and saves into an in-memory buffer (``io.BytesIO``: a best-model snapshot, no
checkpoint a preempted run could resume from), are only counted.

**DCP.** ``torch.distributed.checkpoint.save``, ``async_save`` (where the installed torch has
it) and the deprecated ``save_state_dict`` are wrapped too — the package's attributes, which
``dcp.save(...)`` reads at each call — once the script imports the package
(``runner/postimport.py``: torchdoctor never imports it, ≈ 1-4 s, for a script that does not). A
DCP save writes a folder (``checkpoint_id``, or the storage writer's ``path``): its event has
``target`` ``folder`` and ``folder`` the checkpoint folder itself. The state dict is described as
DCP sees it (a ``Stateful`` optimizer passed as such: its ``state``/``param_groups``, read, not
called); DTensor shards are matched to the live parameters by their local tensors. On every rank
(each rank's child has its own audit). The ``torch.save`` calls DCP's writer makes inside that
folder are its own, not the script's: passed through uncounted.

Events: ``save`` {fn, where (user file:line), step, target (file | stream | folder), name
(the file's base name), folder, layout (a known multi-file layout of that folder, from the
checkpoint family's ``checkpoint/layout.py``: its sibling names), n (the ordinal of this save at
its site), roles, live, matched, nodes, describe_ms[, truncated]}; ``save_sites`` {sites: {where:
saves}, layouts: [[where, n, layout]] recognised at the end, once the folder was complete, renamed:
[[written as, kept as]] (``os.rename``/``os.replace`` of a saved path)}; ``live.counter_schedulers``
in a save: schedulers outside torch's classes stepped with an explicit counter (``save_audit_counted.py``). The resume check
(``save_audit_reset.py``, ``ctx.options["resume_reset"]``) adds ``resume_reset`` and
``lr_trace``.
"""

from __future__ import annotations

import functools
import io
import os
import threading
from typing import Any

from torchdoctor.instruments.base import Instrument, register

MAX_PER_SITE = 2
MAX_DESCRIBED = 20
MAX_NAME = 120


@register
class SaveAudit(Instrument):
    name = "save_audit"
    produces = frozenset({"save", "save_sites", "resume_reset", "lr_trace"})
    priority = 86

    def install(self, ctx: Any) -> None:
        from torchdoctor.instruments.save_audit.save_audit_live import Live
        from torchdoctor.runner.patching import Patches

        self.ctx = ctx
        self.on = True
        self.sites: dict[str, int] = {}
        self.described = 0
        self.unplaced: list[tuple[str, int, str]] = []  # described file saves of no known layout yet
        self.failed = False
        self._local = threading.local()
        self._lock = threading.Lock()
        self.patches = Patches()
        self.dcp_folders: set[str] = set()  # folders DCP saves wrote: its own torch.save calls there pass
        self.dcp_hook = None
        self.live = Live()
        self.reset = None
        if ctx.options.get("resume_reset") or ctx.options.get("resume_trace"):
            from torchdoctor.instruments.save_audit.save_audit_reset import ResumeReset

            self.reset = ResumeReset(ctx, self.live, ctx.options.get("resume_reset") or {})
        self.live.install(ctx, self.patches)
        from torchdoctor.instruments.save_audit.save_audit_counted import Counted

        self.counted = Counted(ctx, self.live, self.patches)
        self.counted.install_renames()
        if self.reset is not None:
            self.reset.install()
        self._wrap_saves()

    def _wrap_saves(self) -> None:
        import importlib.util

        import torch
        import torch.serialization as ser

        same = torch.save is ser.save
        w = self.patches.wrap(torch, "save", self._maker("torch.save", 0, 1), tag="save_audit")
        if same and w is not None:  # one wrapper for both names: `torch.save is torch.serialization.save` holds
            self.patches.set(ser, "save", w, orig=ser.save, tag="save_audit")
        else:
            self.patches.wrap(ser, "save", self._maker("torch.save", 0, 1), tag="save_audit")
        from torchdoctor.runner.postimport import when_imported

        self.dcp_hook = when_imported("torch.distributed.checkpoint", self._wrap_dcp,
                                      on_error=lambda: self._failed("wrapping torch.distributed.checkpoint"))
        if importlib.util.find_spec("safetensors") is None:
            return
        try:
            import safetensors.torch as st
        except Exception:  # noqa: BLE001 - a broken safetensors install: torch.save is still audited
            return
        self.patches.wrap(st, "save_file", self._maker("safetensors.save_file", 0, 1), tag="save_audit",
                          require=False)
        self.patches.wrap(st, "save_model", self._maker("safetensors.save_model", 0, 1), tag="save_audit",
                          require=False)

    def _wrap_dcp(self, mod: Any) -> None:
        """``torch.distributed.checkpoint``'s save functions (module doc), once it is imported."""
        if not self.on:
            return
        for attr in ("save", "async_save", "save_state_dict"):
            self.patches.wrap(mod, attr, self._maker(f"torch.distributed.checkpoint.{attr}", 0, None),
                              tag="save_audit", require=False)

    def _maker(self, fn: str, obj_at: int, file_at: int | None):
        """``file_at`` None: a DCP save (the folder is a keyword: ``checkpoint_id`` / ``storage_writer``)."""
        inst = self

        def make(orig):
            @functools.wraps(orig)
            def save(*a, **k):
                mine = inst.on and not getattr(inst._local, "busy", False) and inst.ctx.in_owner_process()
                if mine and file_at is not None and inst.dcp_folders:
                    mine = not inst._inside_dcp(a[file_at] if len(a) > file_at else k.get("f"))
                if not mine:
                    return orig(*a, **k)
                inst._local.busy = True  # a save inside a save (a custom __reduce__) is not another one
                try:
                    obj = a[obj_at] if len(a) > obj_at else k.get("obj", k.get("tensors", k.get("state_dict")))
                    if file_at is None:
                        site = inst._before_dcp(fn, obj, a, k)
                    else:
                        site = inst._before(fn, obj, a[file_at] if len(a) > file_at else k.get("f", k.get("filename")))
                    out = orig(*a, **k)
                    if site is not None and inst.reset is not None:
                        inst._guard("reset", inst.reset.after_save, *site)
                    return out
                finally:
                    inst._local.busy = False
            return save
        return make

    def _before_dcp(self, fn: str, obj: Any, a: tuple, k: dict) -> tuple[str, int] | None:
        try:
            view, folder = _dcp_view(obj), _dcp_folder(a, k)
        except Exception:  # noqa: BLE001 - the user's save goes on, described as given
            self._failed("DCP arguments")
            view, folder = obj, None
        return self._before(fn, view, folder, dcp=True)

    def _inside_dcp(self, f: Any) -> bool:
        """``f`` (a path or an open file) lies in a folder a DCP save writes: DCP's own write."""
        try:
            name = getattr(f, "name", f)
            path = os.path.abspath(os.fsdecode(name)) if isinstance(name, (str, bytes, os.PathLike)) else None
        except Exception:  # noqa: BLE001
            return False
        return path is not None and os.path.dirname(path) in self.dcp_folders

    def _before(self, fn: str, obj: Any, f: Any, dcp: bool = False) -> tuple[str, int] | None:
        """Count and (for the first saves of a site) describe one save; never raises."""
        try:
            from torchdoctor.runner.frames import user_frame

            uf = user_frame(3)
            where = f"{uf[0]}:{uf[1]}" if uf else "<unknown>"
            target, name, path = _target(f)
            if dcp:
                target = "folder" if path else "stream"  # a storage writer of another kind: no path
                if path:
                    self.dcp_folders.add(path)
            else:
                self.counted.saved_path(path)
            with self._lock:
                n = self.sites[where] = self.sites.get(where, 0) + 1
                # an in-memory snapshot (io.BytesIO: a best-model copy) is no checkpoint a
                # preempted run resumes from: counted, not described
                describe = target != "memory" and n <= MAX_PER_SITE and self.described < MAX_DESCRIBED
                if describe:
                    self.described += 1
        except Exception:  # noqa: BLE001
            self._failed("before save")
            return None
        if describe:
            self._guard("describe", self._describe, fn, obj, target, name, path, where, n)
        return where, n

    def _describe(self, fn: str, obj: Any, target: str, name: str | None, path: str | None, where: str,
                  n: int) -> None:
        from torchdoctor.checkpoint.layout import sibling_layout
        from torchdoctor.instruments.save_audit.save_audit_describe import describe

        folder = path if target == "folder" else os.path.dirname(path) if path else None
        lay = sibling_layout(path) if path and target == "file" else None
        if path and lay is None and target == "file":
            self.unplaced.append((where, n, path))
        self.ctx.emit("save", fn=fn, where=where, step=self.ctx.step, target=target, name=name, n=n,
                      folder=folder, layout=lay["name"] if lay else None, **describe(obj, self.ctx, self.live, self.counted))

    def _guard(self, what: str, fn, *a) -> None:
        try:
            fn(*a)
        except Exception:  # noqa: BLE001 - the user's save must go on
            self._failed(what)

    def _failed(self, what: str) -> None:
        import traceback

        if self.failed:
            return
        self.failed = True
        self.ctx.emit("instrument_error", instrument=self.name, callback=f"torch.save ({what})",
                      traceback=traceback.format_exc(limit=8))

    def on_step_end(self, ctx: Any, step: int) -> None:
        if not self.counted.looked:
            self._guard("scheduler lookup", self.counted.look)
        if self.reset is not None:
            self.reset.on_step_end(step)

    def uninstall(self, ctx: Any) -> None:
        self.on = False
        self.live.active = False
        counted = getattr(self, "counted", None)
        if counted is not None:
            counted.on = False
        if getattr(self, "dcp_hook", None) is not None:
            self.dcp_hook.remove()
        patches = getattr(self, "patches", None)
        if patches is not None:
            patches.undo()
        if getattr(self, "reset", None) is not None:
            self.reset.uninstall()
        if getattr(self, "sites", None):
            ctx.emit("save_sites", sites=dict(self.sites), layouts=self._late_layouts(),
                     renamed=list(counted.renames) if counted is not None else [])

    def _late_layouts(self) -> list:
        """Layouts recognised only once the script wrote the rest of the folder (the first file of an
        accelerate or Trainer checkpoint has no siblings yet when it is saved)."""
        from torchdoctor.checkpoint.layout import sibling_layout

        out = []
        for where, n, path in self.unplaced[:MAX_DESCRIBED]:
            try:
                lay = sibling_layout(path)
            except Exception:  # noqa: BLE001
                lay = None
            if lay is not None:
                out.append([where, n, lay["name"]])
        return out


def _target(f: Any) -> tuple[str, str | None, str | None]:
    """(file | memory | stream, base name of the file or None, its absolute path or None)."""
    if isinstance(f, (str, bytes, os.PathLike)):
        try:
            path = os.path.abspath(os.fsdecode(f))
            return "file", os.path.basename(path)[:MAX_NAME], path
        except Exception:  # noqa: BLE001
            return "file", None, None
    if isinstance(f, io.BytesIO):
        return "memory", None, None
    name = getattr(f, "name", None) or getattr(f, "path", None)
    if not isinstance(name, str):
        return "stream", None, None
    return "stream", os.path.basename(name)[:MAX_NAME], (os.path.abspath(name) if os.path.isabs(name) else None)


def _dcp_folder(a: tuple, k: dict) -> Any:
    """The folder a DCP save writes: ``checkpoint_id``, else the storage writer's ``path`` (the
    deprecated ``save_state_dict(state_dict, storage_writer)`` takes it second)."""
    cid = k.get("checkpoint_id")
    if cid is not None:
        return cid
    w = k.get("storage_writer", a[1] if len(a) > 1 else None)
    p = getattr(w, "path", None) if w is not None else None
    return p if isinstance(p, (str, os.PathLike)) else None


def _dcp_view(obj: Any) -> Any:
    """The state dict as DCP saves it, for the description: a ``Stateful`` optimizer given as such
    (DCP calls its ``state_dict()``) is read as its ``state`` and ``param_groups`` (no call, no
    copy: the same tensors, numbered in order as ``state_dict()`` numbers them); a dict of such
    values is viewed entry by entry. Anything else is described as it is."""
    import torch

    def view(v: Any, deep: bool = True) -> Any:
        if deep and not isinstance(v, (torch.nn.Module, torch.Tensor, dict)) and \
                callable(getattr(v, "state_dict", None)) and isinstance(getattr(v, "__dict__", None), dict) and \
                any(isinstance(x, torch.optim.Optimizer) for x in vars(v).values()):
            return {kk: view(vv, False) for kk, vv in vars(v).items()}  # an app state holding one
        if isinstance(v, torch.optim.Optimizer):
            ids: dict[int, int] = {}
            groups = []
            for g in v.param_groups:
                ps = [ids.setdefault(id(p), len(ids)) for p in g["params"]]
                groups.append({**{kk: vv for kk, vv in g.items() if kk != "params"}, "params": ps})
            state = {ids[id(p)]: st for p, st in v.state.items() if id(p) in ids}
            return {"state": state, "param_groups": groups}
        return v

    if isinstance(obj, dict):
        return {kk: view(vv) for kk, vv in obj.items()}
    return view(obj)
