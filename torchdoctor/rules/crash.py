"""The crash rule: one finding for a script that raised (or exited non-zero).

Classification, from the exception's type and message (the texts torch raises):
``out-of-memory``, ``inplace-modified``, ``device-mismatch``, else ``script-crashed``
(routed to a skill when the message is recognised). Every ``crash_context`` event that an
instrument wrote from ``on_crash`` is merged into that one finding: its ``evidence`` dict
is added, its ``fixes`` come before the generic ones. No other rule raises these codes for
a crash.
"""

from __future__ import annotations

import re
from typing import Any

from torchdoctor.evidence import Evidence
from torchdoctor.findings import Finding, finding
from torchdoctor.report.safe import visible
from torchdoctor.judge import rule
from torchdoctor.runner.frames import short_path
from torchdoctor.skills import (CHECKPOINTING, CUSTOM_AUTOGRAD, DEBUGGING, DISTRIBUTED,
                                MODULE_DESIGN, TENSOR_MEMORY)

OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.I),
    re.compile(r"DefaultCPUAllocator: (can't|not enough memory)", re.I),
    re.compile(r"\bout of memory\b", re.I),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
)
INPLACE_PATTERN = re.compile(r"modified by an inplace operation")
DEVICE_PATTERNS = (
    re.compile(r"Expected all tensors to be on the same device"),
    re.compile(r"Input type \(\S+\) and weight type \(\S+\) should be the same"),
    re.compile(r"Expected object of device type \w+ but got device type \w+"),
    re.compile(r"is on \w+, but expected (it )?to be on \w+"),
    re.compile(r"indices should be either on cpu or on the same device"),
    re.compile(r"Expected a '\w+' device type for generator"),
    re.compile(r"Tensor on device \S+ is not on the expected device \S+!"),
)
# script-crashed routing: (message pattern, skill, hint)
ROUTES: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"Error\(s\) in loading state_dict|Unexpected key\(s\)|Missing key\(s\)|"
                r"PytorchStreamReader"), CHECKPOINTING,
     "checkpoint/state_dict mismatch: compare keys and shapes (torchdoctor checkpoint-audit PATH)"),
    (re.compile(r"NCCL|ProcessGroup|c10d|init_process_group|collective", re.I), DISTRIBUTED,
     "distributed set-up or collective failure: run torchdoctor dist"),
    (re.compile(r"mat1 and mat2 shapes cannot be multiplied|size mismatch|shape .* is invalid "
                r"for input of size|Given groups=\d+, weight of size|expected input\[.*\] to have"),
     MODULE_DESIGN, "a layer's expected input shape differs from what it receives: print the "
                    "shapes at the failing line"),
    (re.compile(r"Trying to backward through the graph a second time|does not require grad and "
                r"does not have a grad_fn|one of the variables needed for gradient computation"),
     CUSTOM_AUTOGRAD, "autograd graph misuse: detach tensors kept across steps, or pass "
                      "retain_graph=True only where a second backward is intended"),
    (re.compile(r"device-side assert triggered|CUDA error: an illegal memory access"), DEBUGGING,
     "re-run with CUDA_LAUNCH_BLOCKING=1 to get the failing line (often an index/label out of "
     "range)"),
)

# torch.load(weights_only=True) refusing a global (the default since torch 2.6); its text carries
# ANSI bold codes, stripped before anything is shown
WEIGHTS_ONLY = re.compile(r"Weights only load failed")
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_ANSI_SGR = re.compile(r"\x1b\[[0-9;]*m")


def weights_only_fix(msg: str) -> str:
    g = _REFUSED_GLOBAL.search(msg)
    name = g.group(1) if g else "..."
    return (f"torch.load refused the file under weights_only=True (the default since torch 2.6): it pickles "
            f"{'the global ' + name if g else 'a global'} outside the allowlist. For a file you trust, allowlist "
            f"the globals: torch.serialization.add_safe_globals([{name}]) or `with "
            f"torch.serialization.safe_globals([{name}]): torch.load(...)` (a numpy RNG state needs "
            "numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype and numpy.dtypes.UInt32DType); "
            "`torchdoctor checkpoint-audit PATH` lists every global the file needs, without running it. "
            "Or torch.load(path, weights_only=False), only for a file you made or fully trust: it runs any "
            "code the file carries")


_GIB = re.compile(r"([\d.]+)\s*(TiB|GiB|MiB|KiB|bytes|B)\b")
_UNITS = {"TiB": 2**40, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1, "B": 1}


def _bytes(text: str) -> int | None:
    m = _GIB.search(text)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def oom_details(msg: str) -> dict[str, Any]:
    """Numbers from an OOM message (CUDA caching allocator or CPU allocator)."""
    out: dict[str, Any] = {}
    m = re.search(r"Tried to allocate ([\d.]+\s*\w+)", msg)
    if m:
        out["requested_bytes"] = _bytes(m.group(1))
    m = re.search(r"you tried to allocate (\d+) bytes", msg)
    if m:
        out["requested_bytes"] = int(m.group(1))
    m = re.search(r"GPU (\d+) has a total capacity of ([\d.]+\s*\w+) of which ([\d.]+\s*\w+) is free", msg)
    if m:
        out["gpu"] = int(m.group(1))
        out["capacity_bytes"] = _bytes(m.group(2))
        out["free_bytes"] = _bytes(m.group(3))
    m = re.search(r"this process has ([\d.]+\s*\w+) memory in use", msg)
    if m:
        out["process_in_use_bytes"] = _bytes(m.group(1))
    m = re.search(r"([\d.]+\s*\w+) is allocated by PyTorch, and ([\d.]+\s*\w+) is reserved by "
                  r"PyTorch but unallocated", msg)
    if m:
        out["allocated_bytes"] = _bytes(m.group(1))
        out["reserved_unallocated_bytes"] = _bytes(m.group(2))
    return out


def device_details(msg: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = re.search(r"found at least two devices, (\S+) and (\S+?)!?( \(|$)", msg)
    if m:
        out["devices"] = [m.group(1).rstrip("!,"), m.group(2).rstrip("!,")]
    m = re.search(r"Tensor on device (\S+) is not on the expected device (\S+?)!", msg)
    if m and "devices" not in out:
        out["devices"] = [m.group(2), m.group(1)]
    m = re.search(r"argument for argument (\w+) in method (\w+)", msg)
    if m:
        out["argument"] = m.group(1)
        out["op"] = m.group(2)
    m = re.search(r"Input type \((\S+)\) and weight type \((\S+)\)", msg)
    if m:
        out["input_type"], out["weight_type"] = m.group(1), m.group(2)
    return out


def inplace_details(msg: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    m = re.search(r"\[(torch\.\S+) \[([\d, ]*)\]\], which is output (\d+) of (\w+), is at version "
                  r"(\d+); expected version (\d+)", msg)
    if m:
        out["tensor"] = f"{m.group(1)} [{m.group(2)}]"
        out["output_of"] = m.group(4)
        out["version"] = f"{m.group(5)} (expected {m.group(6)})"
    return out


def classify(exc: dict[str, Any]) -> str:
    msg = exc.get("message", "")
    typ = exc.get("type", "")
    if typ == "OutOfMemoryError" or any(p.search(msg) for p in OOM_PATTERNS):
        return "out-of-memory"
    if INPLACE_PATTERN.search(msg):
        return "inplace-modified"
    if any(p.search(msg) for p in DEVICE_PATTERNS):
        return "device-mismatch"
    return "script-crashed"


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


def _merge_context(ev: Evidence, evidence: dict[str, Any], fixes: list[str]) -> list[str]:
    extra: list[str] = []
    for c in ev.of("crash_context"):
        evidence.update(c.get("evidence") or {})
        extra += [f for f in (c.get("fixes") or []) if f and f not in extra]
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
        if WEIGHTS_ONLY.search(msg):
            skill, fixes = CHECKPOINTING, [weights_only_fix(msg)]
        for pat, sk, hint in ROUTES if skill is None else ():
            if pat.search(msg):
                skill = sk
                fixes = [hint[0].upper() + hint[1:]] + fixes
                break
    tb = exc.get("traceback") or []
    user_tb = [f"{short_path(f'{f[0]}:{f[1]}')} in {f[2]}" for f in tb if f[3]]
    if len(user_tb) > 1:
        evidence["user_traceback"] = user_tb[-6:]
    fixes = _merge_context(ev, evidence, fixes)
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


@rule("crash", probes={"run"}, needs={"crash_context"},
      raises=["script-crashed", "out-of-memory", "inplace-modified", "device-mismatch"])
def crash(ev: Evidence) -> list[Finding]:
    """A crash (exception) or a non-zero exit code of the script."""
    res = ev.result
    outcome = res.get("outcome")
    if outcome == "crash":
        return [_crash_finding(ev)]
    if outcome == "exit" and res.get("exit_code") not in (0, None):
        return [_exit_finding(ev)]
    return []
