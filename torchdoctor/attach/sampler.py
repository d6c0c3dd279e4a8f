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
import re
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


GIL_RATE_HZ = 50  # GIL-owner samples per second (non-blocking: the target is never paused for them)
_RAW_THREAD = re.compile(r"^thread \((0x[0-9a-fA-F]+|\d+)\)(?::\s?(.*))?$")
_RAW_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


class GilRecord:
    """``py-spy record --gil --nonblocking`` over the window: which thread held the GIL in each of
    ``GIL_RATE_HZ`` samples a second (only samples where a thread holds it are written). Measured
    on tests/fixtures/attach/gil_thread.py (2 s at 50 Hz, loaded 2-core box): a pure-Python
    statistics thread held it in 89 samples, the training thread in 1; py-spy used 0.02 s of CPU."""

    def __init__(self, binary: str, pid: int, duration: float, folder: str) -> None:
        self.pid, self.seconds = pid, max(1, int(round(duration)))
        self.path = os.path.join(folder, f"gil-{pid}.txt")
        self.proc: subprocess.Popen | None = None
        self.error = ""
        cmd = [binary, "record", "--pid", str(pid), "--duration", str(self.seconds), "--rate",
               str(GIL_RATE_HZ), "--nonblocking", "--gil", "--threads", "--format", "raw",
               "--output", self.path]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        except OSError as e:
            self.error = f"py-spy could not start: {e}"

    def stop(self) -> None:
        """End the record now (our own child, by its handle): the attach was interrupted."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def finish(self, timeout: float) -> dict:
        """{"rate_hz", "seconds", "threads": [{"tid", "name", "samples", "top", "top_samples"}]}
        or {"error": ...}; the record is ended (by its PID: our own child) if it overruns."""
        if self.proc is None:
            return {"error": self.error}
        try:
            _, err = self.proc.communicate(timeout=max(0.5, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"error": f"py-spy record did not end within {timeout:.0f} s"}
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                text = f.read(8 << 20)
        except OSError:
            text = None
        if text is None:
            tail = (err or "").strip()[-300:]
            return {"error": tail or f"py-spy record exited {self.proc.returncode} without output"}
        return {"rate_hz": GIL_RATE_HZ, "seconds": self.seconds, "threads": parse_gil_raw(text)}


def parse_gil_raw(text: str) -> list[dict]:
    """py-spy ``record --gil --threads --format raw`` lines ("thread (TID): NAME;frame;...;frame N",
    outermost first) → per thread: samples holding the GIL and its most frequent innermost frame."""
    threads: dict[str, dict] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        m = _RAW_THREAD.match(parts[0])
        if m is None:
            continue
        tid = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
        t = threads.setdefault(str(tid), {"tid": tid, "name": "", "samples": 0, "where": {}})
        frames = parts[1:]
        if m.group(2) is not None:
            t["name"] = m.group(2)
        elif frames and _RAW_FRAME.match(frames[0]) is None:
            t["name"] = frames[0]
        if frames and _RAW_FRAME.match(frames[0]) is None:
            frames = frames[1:]
        t["samples"] += int(count)
        inner = frames[-1] if frames else "?"
        fm = _RAW_FRAME.match(inner)
        key = f"{fm.group(1)} at {fm.group(2)}:{fm.group(3)}" if fm else inner
        t["where"][key] = t["where"].get(key, 0) + int(count)
    out = []
    for t in threads.values():
        top = max(t["where"].items(), key=lambda kv: kv[1]) if t["where"] else ("?", 0)
        out.append({"tid": t["tid"], "name": t["name"], "samples": t["samples"], "top": top[0][:300],
                    "top_samples": top[1]})
    return sorted(out, key=lambda t: -t["samples"])


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
