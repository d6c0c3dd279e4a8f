"""Python stacks of a live process, read by py-spy (a dependency: a static binary wheel on PyPI).

py-spy reads the target's memory through ``process_vm_readv`` (ptrace permission): it sends no
signal and runs no code in the target. By default it pauses the target while it reads the
stacks (a consistent snapshot; the pause is measured in docs/attach.md); ``nonblocking=True``
does not pause it at all, at the risk of a torn stack. Chosen over pystack after measuring both
on Python 3.11 as root (docs/attach.md): py-spy 0.23-0.29 s a dump with JSON output, pystack
1.3-4.4 s a dump with text output.

Measurement only: a dump becomes plain dicts; a failure becomes a classified error string.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time

from torchdoctor.errors import DoctorError

PERMISSION_HINT = (
    "ptrace is not permitted here. In a container, start it with `--cap-add SYS_PTRACE` "
    "(docker/podman; Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]); on a host with "
    "Yama, allow it with `sudo sysctl kernel.yama.ptrace_scope=0` (or run torchdoctor as root / as "
    "the job's user with `sudo`)")


def find_pyspy() -> str | None:
    """The py-spy binary of this environment (next to this Python), else one on PATH."""
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        p = os.path.join(d, "py-spy")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which("py-spy")


def require_pyspy() -> str:
    p = find_pyspy()
    if p is None:
        raise DoctorError("py-spy is not installed in this environment (attach reads stacks with it)",
                          "pip install py-spy  (a binary wheel; it comes with torchdoctor's dependencies)")
    return p


def version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().split()[-1] if out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def classify_error(text: str) -> str:
    """"permission" | "gone" | "not-python" | "other" from py-spy's error output."""
    low = text.lower()
    if "permission" in low or "operation not permitted" in low or "os error 1)" in low:
        return "permission"
    if "no such process" in low or "no such file" in low or "os error 3)" in low:
        return "gone"
    if "python" in low and ("failed to find" in low or "not a python" in low
                            or "failed to get" in low):
        return "not-python"
    return "other"


def _frames(raw: list) -> list[dict]:
    return [{"name": str(f.get("name", "?")), "file": str(f.get("filename", "?")),
             "line": int(f.get("line") or 0)} for f in raw or []]


def parse_dump(text: str) -> list[dict]:
    """py-spy ``dump --json`` → threads: tid, name, active, gil, frames (innermost first)."""
    data = json.loads(text)
    out = []
    for t in data:
        out.append({"tid": t.get("os_thread_id") or t.get("thread_id"),
                    "name": t.get("thread_name") or "", "active": bool(t.get("active")),
                    "gil": bool(t.get("owns_gil")), "frames": _frames(t.get("frames"))})
    return out


def dump(binary: str, pid: int, timeout: float, nonblocking: bool = False,
         native: bool = False) -> dict:
    """One snapshot of ``pid``: {"t": wall start, "read_s": seconds, "threads": [...]} or
    {"t", "error", "kind"} — never raises for a failed read."""
    cmd = [binary, "dump", "--pid", str(pid), "--json"]
    if nonblocking:
        cmd.append("--nonblocking")
    if native:
        cmd.append("--native")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"t": t0, "error": f"py-spy did not answer within {timeout:g} s", "kind": "other"}
    except OSError as e:
        return {"t": t0, "error": f"py-spy could not start: {e}", "kind": "other"}
    took = time.time() - t0
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout or "").strip()
        return {"t": t0, "error": text[-500:] or f"py-spy exited {proc.returncode}",
                "kind": classify_error(text)}
    try:
        threads = parse_dump(proc.stdout)
    except (ValueError, AttributeError, TypeError) as e:
        return {"t": t0, "error": f"unreadable py-spy output: {e}", "kind": "other"}
    return {"t": t0, "read_s": round(took, 3), "threads": threads}


def check_permitted(binary: str, pid: int, timeout: float) -> None:
    """One dump before the window: a permission problem is exit 2 with the fix, not a report."""
    d = dump(binary, pid, timeout)
    if "error" not in d:
        return
    if d["kind"] == "permission":
        raise DoctorError(f"not permitted to read the stacks of PID {pid} (ptrace)", PERMISSION_HINT)
    if d["kind"] == "gone":
        raise DoctorError(f"PID {pid} ended before it could be read", "check the PID with `ps -ef`")
    if d["kind"] == "not-python":
        raise DoctorError(f"PID {pid} is not a Python process py-spy can read",
                          "give the PID of the training process (with --job: the launcher's PID)")
