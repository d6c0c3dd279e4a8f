"""The crash rule: one finding for a script that raised (or exited non-zero).

Classification, from the exception's type and message (the texts torch raises, recognised by the
error-text table ``torchdoctor/errortext/`` that ``ask`` reads too): ``out-of-memory``,
``inplace-modified``, ``device-mismatch``, else ``script-crashed`` (routed to a skill when a
"crash-route" row finds its text). Every ``crash_context`` event that an
instrument wrote from ``on_crash`` is merged into that one finding: its ``evidence`` dict
is added, its ``fixes`` come before the generic ones. No other rule raises these codes for
a crash.
"""

from __future__ import annotations

import re
from typing import Any

from torchdoctor.catalog import declare
from torchdoctor.errortext import match
from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.judge import rule
from torchdoctor.safe import visible
from torchdoctor.rules.run import INTERNAL_ERROR
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import CHECKPOINTING, CUSTOM_AUTOGRAD, DEBUGGING

SCRIPT_CRASHED = declare("script-crashed", DEBUGGING, "error",
                         "the script raised: exception, message, the last frame in user code")
# the codes of a recognised crash, declared with their families (rules/memory.py: out-of-memory;
# rules/numerics.py: inplace-modified, device-mismatch) and raised here from the exception's text
OUT_OF_MEMORY, INPLACE_MODIFIED, DEVICE_MISMATCH = "out-of-memory", "inplace-modified", "device-mismatch"

# what a crash is, from its message: the first of these codes that a row of the error-text table
# (torchdoctor/errortext/table.py, the rows with that ``code``) finds in it; else script-crashed
CRASH_CODES = (OUT_OF_MEMORY, INPLACE_MODIFIED, DEVICE_MISMATCH)
# the numbers of an OOM message shown as the crash finding's evidence, in this order
OOM_FIELDS = ("requested_bytes", "gpu", "capacity_bytes", "free_bytes", "process_in_use_bytes",
              "allocated_bytes", "reserved_unallocated_bytes")
_ANSI_SGR = re.compile(r"\x1b\[[0-9;]*m")  # torch.load's weights_only text carries bold codes


def weights_only_fix(msg: str) -> str:
    name = match.extract("refused_global", msg, None).get("global")
    what = f"the global {name}" if name else "a global"
    name = name or "..."
    return (f"torch.load refused the file under weights_only=True (the default since torch 2.6): it pickles "
            f"{what} outside the allowlist. For a file you trust, allowlist "
            f"the globals: torch.serialization.add_safe_globals([{name}]) or `with "
            f"torch.serialization.safe_globals([{name}]): torch.load(...)` (a numpy RNG state needs "
            "numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype and numpy.dtypes.UInt32DType); "
            "`torchdoctor checkpoint-audit PATH` lists every global the file needs, without running it. "
            "Or torch.load(path, weights_only=False), only for a file you made or fully trust: it runs any "
            "code the file carries")


def oom_details(msg: str) -> dict[str, Any]:
    """Numbers from an OOM message (CUDA caching allocator or CPU allocator)."""
    n = match.extract("oom", msg, None)
    return {k: n[k] for k in OOM_FIELDS if k in n}


def device_details(msg: str) -> dict[str, Any]:
    return match.extract("device_details", msg, None)


def inplace_details(msg: str) -> dict[str, Any]:
    return match.extract("inplace_details", msg, None)


def classify(exc: dict[str, Any]) -> str:
    if exc.get("type", "") == "OutOfMemoryError":
        return OUT_OF_MEMORY
    return match.code_of(exc.get("message", ""), CRASH_CODES) or SCRIPT_CRASHED.code


def route(msg: str) -> tuple[str | None, str | None]:
    """(skill, first fix) of a plain script-crashed: the first "crash-route" row in the message."""
    found = match.search(msg, match.rows(group="crash-route"))
    if found is None:
        return None, None
    return found[0].skill, found[0].hint


def phase_of(tb: list[list]) -> str | None:
    """The loop phase a crash happened in, from the library frames of its traceback."""
    for f in reversed(tb):
        path, func = f[0].replace("\\", "/"), f[2]
        if "/torch/autograd/" in path or (path.endswith("torch/_tensor.py") and func == "backward"):
            return "backward"
        if "/torch/optim/" in path:
            return "optimizer"
        if "/torch/utils/data/" in path:
            return "data"
        if path.endswith("torch/nn/modules/module.py") and func in ("_call_impl",
                                                                       "_wrapped_call_impl"):
            return "forward"
    return None


def _where(exc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    uf = exc.get("user_frame")
    if not uf:
        tb = exc.get("traceback") or []
        if tb:
            f = tb[-1]
            loc = short_path(f"{f[0]}:{f[1]}")
            return loc, {"where": f"{loc} in {f[2]}"}
        return "", {}
    loc = short_path(f"{uf['file']}:{uf['line']}")
    ev = {"where": f"{loc} in {uf['function']}"}
    if uf.get("code"):
        ev["code"] = uf["code"]
    return loc, ev


def _first_line(msg: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in msg.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _merge_context(ev: Evidence, evidence: dict[str, Any], fixes: list[str], code: str,
                   exc: dict[str, Any]) -> list[str]:
    extra: list[str] = []
    for c in ev.of("crash_context"):
        if c.get("for_code", code) != code:  # measured at every crash, about another kind
            continue
        c_ev, c_fixes = c.get("evidence") or {}, c.get("fixes") or []
        if "oom" in c:  # the memory sampler's measurement: its fixes are ranked here
            from torchdoctor.memory.oom import oom_context

            tb = exc.get("traceback") or []
            user = [f for f in tb if f[3]]
            c_ev, c_fixes = oom_context(c["oom"], oom_details(exc.get("message", "")), phase_of(tb),
                                        short_path(f"{user[-1][0]}:{user[-1][1]}") if user else None)
        evidence.update(c_ev)
        extra += [f for f in c_fixes if f and f not in extra]
    return extra + [f for f in fixes if f not in extra]


def _crash_finding(ev: Evidence) -> Finding:
    res = ev.result
    exc = res.get("exception") or {}
    code = classify(exc)
    msg = _ANSI_SGR.sub("", exc.get("message", ""))
    loc, evidence = _where(exc)
    steps = int(res.get("steps") or 0)
    evidence = {"exception": f"{exc.get('type', '?')}: {_first_line(msg, 400)}", **evidence,
                "step": f"{steps + 1} (after {steps} completed steps)"}
    phase = phase_of(exc.get("traceback") or [])
    if phase:
        evidence["phase"] = phase
    at = f" at {loc}" if loc else ""
    skill = None
    if code == "out-of-memory":
        evidence.update(oom_details(msg))
        title = f"out of memory{at} during step {steps + 1}"
        fixes = ["Reduce the batch size (use gradient accumulation to keep the effective batch)",
                 "use mixed precision (torch.autocast with bf16) to halve activation memory",
                 "activation checkpointing for the largest blocks",
                 "run `torchdoctor memory` for the breakdown of what was live"]
    elif code == "inplace-modified":
        evidence.update(inplace_details(msg))
        title = f"a tensor needed for backward was modified in place; backward failed{at}"
        fixes = ["Replace the in-place op on that tensor by its out-of-place form (x = x + y, "
                 "relu(inplace=False), .clone() before modifying)",
                 "re-run under torch.autograd.set_detect_anomaly(True) to name the forward line"]
        if "Function" in msg or "ctx.save_for_backward" in msg:
            skill = CUSTOM_AUTOGRAD
    elif code == "device-mismatch":
        evidence.update(device_details(msg))
        devs = evidence.get("devices")
        title = (f"tensors on different devices ({' and '.join(devs)}){at}" if devs
                 else f"tensors on different devices{at}")
        fixes = ["Move the model once before the loop (model.to(device)) and every batch "
                 "(x = x.to(device)) in the loop",
                 "register constant tensors as buffers (self.register_buffer) so .to() moves them",
                 "create new tensors on the right device (torch.zeros(..., device=x.device))"]
    else:
        title = f"the script raised {exc.get('type', 'an exception')}{at}: {visible(_first_line(msg, 120))}"
        fixes = ["Fix the error at the line shown; the full traceback is in the script's output "
                 "above"]
        if match.matches(msg, match.rows(group="weights-only")):
            skill, fixes = CHECKPOINTING, [weights_only_fix(msg)]
        else:
            skill, hint = route(msg)
            if hint:
                fixes = [hint[0].upper() + hint[1:]] + fixes
    tb = exc.get("traceback") or []
    user_tb = [f"{short_path(f'{f[0]}:{f[1]}')} in {f[2]}" for f in tb if f[3]]
    if len(user_tb) > 1:
        evidence["user_traceback"] = user_tb[-6:]
    fixes = _merge_context(ev, evidence, fixes, code, exc)
    return finding(code, title, evidence, fix="; ".join(fixes), skill=skill)


def _exit_finding(ev: Evidence) -> Finding:
    res = ev.result
    code = res.get("exit_code")
    tail = [ln for ln in res.get("output_tail") or [] if ln.strip()][-5:]
    evidence: dict[str, Any] = {"exit_code": code, "steps": res.get("steps", 0)}
    if tail:
        evidence["last_output"] = tail
    how = "sys.exit" if not res.get("no_result") else "os._exit or a hard exit"
    from torchdoctor.rules.misplaced import misplaced_options

    argv = list(ev.meta.get("argv") or [])
    wrong = misplaced_options(res, argv[1:])
    if wrong:  # torchdoctor's options written after SCRIPT went to the script, which refused them
        names = " ".join(wrong)
        evidence["refused_options"] = wrong
        return finding(
            "script-crashed",
            f"the script refused {names}: torchdoctor's options go before SCRIPT, everything "
            f"after it is passed to the script", evidence,
            fix=f"Move {names} (with its value) before the script: torchdoctor "
                f"{ev.meta.get('probe') or 'checkup'} {names} ... {argv[0] if argv else 'SCRIPT'} "
                f"[the script's own arguments]")
    return finding("script-crashed", f"the script exited with code {code} ({how})", evidence,
                   fix="Read the script's last output above: a non-zero exit code means it gave "
                       "up (bad arguments, missing file, failed check)")


def _internal_finding(ev: Evidence) -> Finding:
    """The run died of an exception raised by torchdoctor's own code inside the user's (a hook, an
    instrument's measurement): torchdoctor's fault, never the script's."""
    res = ev.result
    exc = res.get("exception") or {}
    ours = exc.get("torchdoctor_frame") or {}
    msg = _ANSI_SGR.sub("", exc.get("message", ""))
    loc, evidence = _where(exc)
    where = short_path(f"{ours.get('file')}:{ours.get('line')}")
    evidence = {"exception": f"{exc.get('type', '?')}: {_first_line(msg, 400)}",
                "raised_in": f"{where} in {ours.get('function')}", **evidence,
                "step": int(res.get("steps") or 0), "probe": ev.meta.get("probe")}
    at = f" (called from {loc})" if loc else ""
    return finding("internal-error",
                   f"torchdoctor broke the run: its own code raised {exc.get('type', 'an exception')} "
                   f"inside the script{at}; the script itself is not at fault", evidence,
                   severity="error",
                   fix="This is a torchdoctor bug, not yours: the script runs without torchdoctor; "
                       "please report it with this report. Another probe may still work on this "
                       "script")


@rule("crash", probes={"run"}, needs={"crash_context"},
      raises=[SCRIPT_CRASHED, OUT_OF_MEMORY, INPLACE_MODIFIED, DEVICE_MISMATCH, INTERNAL_ERROR])
def crash(ev: Evidence) -> list[Finding]:
    """A crash (exception) or a non-zero exit code of the script."""
    res = ev.result
    outcome = res.get("outcome")
    if outcome == "crash" and (res.get("exception") or {}).get("torchdoctor_frame"):
        return [_internal_finding(ev)]
    if outcome == "crash":
        return [_crash_finding(ev)]
    if outcome == "exit" and res.get("exit_code") not in (0, None):
        return [_exit_finding(ev)]
    return []
