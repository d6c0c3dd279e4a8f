"""The child harness: run the user's script once, unmodified, under the armed instruments.

Started by :mod:`torchdoctor.runner.launch` as ``python -c BOOT RUN_DIR`` in a new session;
the boot binds it to the parent first (:mod:`torchdoctor.runner.lifeline`: it dies with
torchdoctor, and stops itself 30 s past its --timeout if nobody did).
Reads ``meta.json`` (probe, argv, module, options), installs the core (step clock, patches)
and the probe's instruments, rewrites ``sys.argv`` and ``sys.path[0]`` the way ``python
script.py`` / ``python -m mod`` would, runs the script with :mod:`runpy` as ``__main__`` and
writes ``result.json`` however the script ends:

* ``exit``: returned or ``sys.exit(code)`` (the code is kept and becomes the child's code);
* ``stopped``: ``--steps`` reached or an instrument asked to stop, at a step boundary;
* ``crash``: an exception escaped (type, message, traceback with user-code flags);
* ``interrupted``: ``KeyboardInterrupt`` (the parent forwards Ctrl-C as SIGINT).

The parent adds ``timeout`` and ``signal`` outcomes, which the child cannot write itself.
``faulthandler`` dumps every thread's stack to ``stacks.txt`` on SIGUSR1 (timeout) and on a
fatal signal (segfault, abort).

Under torchrun (``--nproc-per-node``, see :mod:`torchdoctor.distributed.rankdir`) each rank uses its
own run dir ``RUN_DIR/rank{RANK}`` and also dumps its stacks on SIGTERM (torchrun stopping it
after another rank failed) before dying.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import platform
import runpy
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from torchdoctor.runner.device import emit_device
from torchdoctor.runner.rundir import META, RESULT, STACKS, EvidenceWriter, read_json, write_json

EXIT_INTERRUPTED = 130
_HARNESS_FILES = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")


def _armed(needs: list[str]) -> list[Any]:
    """Instances of the instruments that produce an evidence kind of ``needs``: what the rules
    of the run's probe and of every run (probe 'run') read, computed by the parent (meta.json;
    ``torchdoctor.pipeline.registry.armed_needs``)."""
    from torchdoctor.instruments import instruments_producing

    classes = list(instruments_producing(needs))
    # TORCHDOCTOR_DISABLE=name,name (or "all"): leave instruments out, to measure their cost
    off = {x.strip() for x in os.environ.get("TORCHDOCTOR_DISABLE", "").split(",") if x.strip()}
    classes = [c for c in classes if "all" not in off and c.name not in off]
    classes.sort(key=lambda c: (c.priority, c.name))
    return [c() for c in classes]


def _trim(tb):
    """Drop the harness/runpy frames in front of the script's first frame."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in _HARNESS_FILES
                              or os.path.abspath(tb.tb_frame.f_code.co_filename) in _HARNESS_FILES):
        tb = tb.tb_next
    return tb


def step_facts(ctx: Any, core: Any) -> dict[str, Any]:
    """The result's step count, and when it is 0 while other threads trained (their step
    boundaries seen before the clock could follow one: they ended while the main thread was
    still starting them), how many: no-training-steps says so (rules/run.py)."""
    out: dict[str, Any] = {"steps": ctx.step}
    if core is not None and not ctx.step and core.foreign_boundaries:
        out["other_thread_boundaries"] = core.foreign_boundaries
    return out


def _exception_record(exc: BaseException) -> dict[str, Any]:
    from torchdoctor.runner.frames import frames_of

    tb = _trim(exc.__traceback__)
    frames = frames_of(tb)
    rec: dict[str, Any] = {
        "type": type(exc).__name__,
        "qualname": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:8000],
        "traceback": frames,
    }
    from torchdoctor.runner.frames import torchdoctor_origin

    ours = torchdoctor_origin(tb)
    if ours is not None:  # raised by torchdoctor's own code inside the user's: not the script's
        rec["torchdoctor_frame"] = {"file": ours[0], "line": ours[1], "function": ours[2]}
    user = [f for f in frames if f[3]]
    if user:
        f = user[-1]
        rec["user_frame"] = {"file": f[0], "line": f[1], "function": f[2],
                             "code": linecache.getline(f[0], f[1]).strip()}
    chain = []
    cur = exc
    while len(chain) < 4:
        nxt = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
        if nxt is None:
            break
        chain.append({"type": type(nxt).__name__, "message": str(nxt)[:2000]})
        cur = nxt
    if chain:
        rec["chain"] = chain
    return rec


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints the message and exits 1


def _run_target(meta: dict[str, Any]) -> None:
    """Run the target like ``python script.py ARGS`` / ``python -m module ARGS`` would."""
    argv = list(meta["argv"])
    if meta.get("module"):
        sys.argv = [argv[0]] + argv[1:]  # run_module replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        return
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)  # argv[0] as the user typed it
    sys.path[0] = os.path.dirname(script)
    if os.path.isdir(script) or not script.endswith(".py"):
        runpy.run_path(script, run_name="__main__")  # folders/zips with __main__.py
        return
    import importlib.machinery
    import types

    with open(script, "rb") as f:
        source = f.read()
    code = compile(source, script, "exec", dont_inherit=True)
    mod = types.ModuleType("__main__")
    mod.__dict__.update(__file__=script, __cached__=None, __builtins__=__builtins__,
                        __loader__=importlib.machinery.SourceFileLoader("__main__", script),
                        __spec__=None, __package__=None)
    sys.modules["__main__"] = mod  # pickling and multiprocessing look the script up here
    exec(code, mod.__dict__)


STOP_BY_TIMEOUT = "--timeout reached"


def _join_script_threads() -> None:
    """Wait for the script's non-daemon threads, as the interpreter would before exiting,
    so that the instruments are never removed under a thread that still trains (the core's
    hooks are no-ops from teardown on all the same, for daemon threads). Threads that only
    the interpreter's exit wakes (``concurrent.futures`` workers) are not waited for; a
    second Ctrl-C stops the wait, as it stops Python's own."""
    import threading

    me = threading.current_thread()
    for t in threading.enumerate():
        target = getattr(t, "_target", None)
        if (t is me or t.daemon or t.name.startswith("torchdoctor-")
                or getattr(target, "__module__", "").startswith("concurrent.futures")):
            continue
        try:
            t.join()
        except KeyboardInterrupt:
            return
        except Exception:  # noqa: BLE001 - a dummy thread (started outside threading)
            continue


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0])
    meta = read_json(run_dir / META) or {}
    from torchdoctor.distributed.rankdir import enter_rank_dir, is_ranked

    ranked = is_ranked()
    if ranked:  # one of torchrun's ranks: its own run dir D/rank{R}
        run_dir, meta = enter_rank_dir(run_dir, meta)
    stacks = open(run_dir / STACKS, "a", buffering=1)
    faulthandler.enable(file=stacks, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    if ranked:  # torchrun stops the other ranks with SIGTERM when one fails: keep where they were
        faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
    from torchdoctor.runner import lifeline

    # the parent-pid fallback and the run's own deadline: no run outlives torchdoctor or its bound
    lifeline.watch(lifeline.deadline_of(meta), stacks)

    from torchdoctor.runner.context import HarnessContext, StopRun
    from torchdoctor.runner.core import Core

    writer = EvidenceWriter(run_dir)
    ctx = HarnessContext(meta.get("probe", "run"), run_dir, meta.get("options", {}), writer)
    if hasattr(signal, "SIGUSR2") and not ranked:
        # --timeout reached while the script still makes steps: the parent asks for a clean stop
        # at the next step boundary, so every instrument still writes its summary.
        signal.signal(signal.SIGUSR2, lambda _s, _f: ctx.request_stop(STOP_BY_TIMEOUT))
    result: dict[str, Any] = {"outcome": "exit", "exit_code": 0}
    core = None
    guard = None
    try:
        import torch

        if ctx.options.get("guard_files"):  # a re-run: the user's files are put back after it
            from torchdoctor.runner import fileguard
            from torchdoctor.runner.patching import Patches

            guard = Patches()
            # a rank guards its own writes in D/rank{R}; the parent puts back every rank's
            # (fileguard.restore(D)); the other ranks' dirs are torchdoctor's, not the user's
            fileguard.install(run_dir, guard, also_skip=run_dir.parent if ranked else None)

        ctx.emit("env", python=platform.python_version(), torch=torch.__version__,
                 cuda_build=torch.version.cuda, pid=os.getpid(),
                 cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count())
        core = Core(ctx, _armed(meta.get("needs") or []))
        core.install()
        ctx.emit("script_start")
        _run_target(meta)
    except StopRun as e:
        result = {"outcome": "stopped", "exit_code": 0, "reason": str(e)}
    except SystemExit as e:
        result = {"outcome": "exit", "exit_code": _exit_code(e.code)}
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        result = {"outcome": "interrupted", "exit_code": EXIT_INTERRUPTED}
    except BaseException as e:  # noqa: BLE001 - the script's crash is evidence
        result = {"outcome": "crash", "exit_code": 1, "exception": _exception_record(e),
                  "phase": ctx.phase}
        if core is not None:
            core.crash(e)
        traceback.print_exception(type(e), e, _trim(e.__traceback__), file=sys.stderr)
    finally:
        result.update(step_facts(ctx, core))
        if core is not None:
            _join_script_threads()
            core.uninstall()
        if guard is not None:
            from torchdoctor.runner import fileguard

            fileguard.stop()
            guard.undo()
        try:
            emit_device(ctx)
        except Exception:  # noqa: BLE001
            pass
        write_json(run_dir / RESULT, result)
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return int(result.get("exit_code") or 0)


if __name__ == "__main__":
    sys.exit(main())
