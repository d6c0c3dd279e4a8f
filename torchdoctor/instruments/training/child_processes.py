"""Processes the script starts itself (``multiprocessing``): what runs in them, by its target.

torchdoctor measures the process it launches. A script that trains in processes it starts
itself (Hogwild with ``mp.Process``, DDP through ``torch.multiprocessing.spawn``) shows no step
there; the report must say where the training went instead of "point torchdoctor at the script
that trains". ``multiprocessing.process.BaseProcess.start`` is wrapped (through
``runner/patching.py``): after the original returned, the started process's target is recorded
by name and file:line — for ``torch.multiprocessing.spawn`` the function it wraps — with the
start method and pid. DataLoader workers, managers and pool workers are counted by kind, not as
the script's own code. Only starts in the launched process are recorded (not in its forked
children). Nothing is kept on the Process object; its pickling (spawn) is unchanged.
Cost: one wrapper call per process started. Event: ``process_started`` at each start (at once:
a run stopped at its timeout while it waits for them has them; the first MAX_EVENTS, then one
``process_started`` with ``dropped``: the count of later starts, at the end).
"""

from __future__ import annotations

import os
from typing import Any

from torchdoctor.instruments.base import Instrument, register
from torchdoctor.runner.patching import Patches

MAX_EVENTS = 64  # starts written one by one; later ones are counted
# targets of processes that libraries start on the script's behalf: not the script's own code
LIBRARY_TARGETS = {
    "torch.utils.data._utils.worker._worker_loop": "DataLoader worker",
    "multiprocessing.pool.worker": "multiprocessing pool worker",
    "multiprocessing.managers.BaseManager._run_server": "multiprocessing manager",
}
SPAWN_WRAP = "torch.multiprocessing.spawn._wrap"  # mp.spawn's target: args = (fn, i, args, ...)


def describe_target(target: Any, args: tuple) -> dict[str, Any]:
    """{"target": dotted name, "where": file:line of its code, "role": what it is}."""
    from torchdoctor.runner.frames import is_user_file

    name = _dotted(target)
    via = None
    if name == SPAWN_WRAP and len(args) >= 1 and callable(args[0]):
        via, target = "torch.multiprocessing.spawn", args[0]
        name = _dotted(target)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None
    role = LIBRARY_TARGETS.get(name)
    if role is None:
        role = "script" if code is not None and is_user_file(code.co_filename) else "library"
    out = {"target": name, "where": where, "role": role}
    if via:
        out["via"] = via
    return out


def _dotted(fn: Any) -> str:
    if fn is None:
        return "(run method)"
    mod = getattr(fn, "__module__", None) or "?"
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{mod}.{qual}"


@register
class ChildProcesses(Instrument):
    name = "child_processes"
    produces = frozenset({"process_started"})

    def install(self, ctx: Any) -> None:
        import multiprocessing.process as mpp

        self.written = self.dropped = 0
        self.patches = Patches()
        owner_pid = os.getpid()
        inst = self

        def make(orig):
            def start(process, *a, **kw):
                # read before: start() deletes _target and _args once the process is started
                mine = os.getpid() == owner_pid
                target = getattr(process, "_target", None) if mine else None
                args = getattr(process, "_args", ()) if mine else ()
                out = orig(process, *a, **kw)
                if mine:
                    try:
                        inst._record(ctx, process, target, args)
                    except Exception:  # noqa: BLE001 - never break the user's start()
                        inst.hook_failed(ctx, "start")
                return out
            return start

        self.patches.wrap(mpp.BaseProcess, "start", make, tag="child_processes")

    def _record(self, ctx: Any, process: Any, target: Any, args: Any) -> None:
        if self.written >= MAX_EVENTS:
            self.dropped += 1
            return
        if target is None and type(process).run is not _base_run():
            target = type(process).run  # a Process subclass with its own run()
        d = describe_target(target, tuple(args or ()))
        popen = getattr(process, "_popen", None)
        d["method"] = getattr(popen, "method", None) or type(popen).__module__.rpartition("_")[2]
        self.written += 1
        ctx.emit("process_started", pid=getattr(process, "pid", None), **d)

    def uninstall(self, ctx: Any) -> None:
        self.patches.undo()
        if self.dropped:
            ctx.emit("process_started", dropped=self.dropped)


def _base_run() -> Any:
    import multiprocessing.process as mpp

    return mpp.BaseProcess.run
